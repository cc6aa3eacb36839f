"""Milliseconds per decoder layer of each kind inside the target's real forward (dflash-train --plan and
benchmarks/target_forward.py): each layer wrapped, after compile_layers, in a module that records a CUDA event before
and after it, so the events stay outside the compiled graphs."""

from __future__ import annotations

from dflash_trainer.model.target import layer_kinds

KIND_ORDER = ("linear_attention", "full_attention", "default")


def decoder_layers(target):
    return target.model.model.layers


class TimedLayers:
    """Wraps each decoder layer (a ModuleList of TimedLayer) while in use; `per_kind()`: median ms per layer."""

    def __init__(self, target):
        import torch

        class TimedLayer(torch.nn.Module):
            def __init__(self, inner, kind, marks):
                super().__init__()
                self.inner, self.kind, self.marks = inner, kind, marks

            def forward(self, *args, **kwargs):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = self.inner(*args, **kwargs)
                end.record()
                self.marks.append((self.kind, start, end))
                return out

        self.torch, self.target, self.marks, self.calls = torch, target, [], []
        self.inner = decoder_layers(target)
        self.kinds = layer_kinds(target.config, len(self.inner))
        self.wrapped = torch.nn.ModuleList(TimedLayer(layer, kind, self.marks)
                                           for layer, kind in zip(self.inner, self.kinds))

    def __enter__(self):
        self.target.model.model.layers = self.wrapped
        return self

    def __exit__(self, *exc):
        self.target.model.model.layers = self.inner

    def call(self, fn):
        """fn() once, its layers' events collected (after a synchronize) into one {kind: ms of all its layers}."""
        self.marks.clear()
        out = fn()
        self.torch.cuda.synchronize()
        sums = {}
        for kind, start, end in self.marks:
            sums[kind] = sums.get(kind, 0.0) + start.elapsed_time(end)
        self.calls.append(sums)
        return out

    def per_kind(self) -> dict:
        """{kind: {"layers": n, "ms_per_layer": median over calls of (ms of the kind's layers / n)}}."""
        counts = {k: self.kinds.count(k) for k in set(self.kinds)}
        out = {}
        for kind in sorted(counts, key=KIND_ORDER.index):
            values = sorted(c[kind] / counts[kind] for c in self.calls)
            out[kind] = {"layers": counts[kind], "ms_per_layer": values[len(values) // 2]}
        return out


def events_ms(per_kind: dict) -> float:
    """What the kinds' layers take together: layers x ms per layer, summed."""
    return sum(k["layers"] * k["ms_per_layer"] for k in per_kind.values())


def fit_to_forward(per_kind: dict, forward_ms: float) -> tuple[dict, float, float]:
    """The kinds' ms per layer made to add up to the untimed forward: where the events of the timed forwards sum to
    more than the untimed forward's median (by 0.2-9.4 % in benchmarks/target_forward.py on one H200, 2026-12-04),
    each kind's ms is scaled down alike, so the events give the kinds' shares and the untimed forward the total;
    where they sum to less, the difference is the rest (embedding, final norm). Returns (per_kind with
    "ms_per_layer" fitted and "ms_per_layer_events" as measured, rest ms, the scale)."""
    total = events_ms(per_kind)
    scale = min(1.0, forward_ms / total) if total > 0 else 1.0
    fitted = {kind: dict(k, ms_per_layer_events=k["ms_per_layer"], ms_per_layer=k["ms_per_layer"] * scale)
              for kind, k in per_kind.items()}
    return fitted, max(0.0, forward_ms - total * scale), scale


def at_busy_pace(per_kind: dict, rest_ms: float, pace: float) -> tuple[dict, float]:
    """The kinds' ms per layer and the rest at the pace of forwards run back to back (busy_timing): pace = the busy
    forward's ms / the forward's alone, so each kind keeps its share and the whole is the busy forward's. Returns
    (per_kind with "ms_per_layer" at that pace and "ms_per_layer_alone" as fitted, the rest at that pace)."""
    busy = {kind: dict(k, ms_per_layer_alone=k["ms_per_layer"], ms_per_layer=k["ms_per_layer"] * pace)
            for kind, k in per_kind.items()}
    return busy, rest_ms * pace
