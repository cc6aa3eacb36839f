"""The proof's held-out prompt sets and where their figures go in proof.json: shared by the evaluation worker
(proof_eval.py), the report (proof_report.py) and compare_proofs.py, which reads reports without torch."""

# The prompt sets, in evaluation order: name -> the settings keys of their file and of their prompt count (None: all)
SETS = {"split": ("eval_prompts", None), "other_styles": ("other_styles", "num_other_styles")}
SET_LABELS = {"split": "the proof's split", "other_styles": "other styles"}


def result_key(key: str, name: str) -> str:
    """Where a set's figures go in the report: the split's under the key reports have always used ("eval",
    "baseline", "target_only"), the other sets' under key_<set> ("eval_other_styles")."""
    return key if name == "split" else f"{key}_{name}"
