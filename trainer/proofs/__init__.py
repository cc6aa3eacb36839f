"""The proofs that a trained drafter reaches its τ (trainer/docs/PROOF.md), run from `trainer/` as modules of this
package, e.g.

    python -m proofs.proof_smollm2 --tiny --out /tmp/proof-tiny
    python -m proofs.proof_toy_cpu --out /tmp/proof-toy

(the trainer importable: installed, as `scripts/setup` does, or `trainer/src` on PYTHONPATH). Their recorded
reports are in `trainer/results/` (its README indexes them)."""
