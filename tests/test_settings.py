"""Setting labels name what made a different model before how it was tested, so a label cut
after three fields still shows the training change."""

from __future__ import annotations

from lengthgen.leaderboard.settings import differences, short_label


def config(steps: int, layers: int, max_factor: int, samples: int, preset: str = "paper-tasks") -> dict:
    return {"task": "mqmtar", "attn": "asentmax", "pos": "nape", "seed": 0, "preset": preset,
            "arch": {"n_layers": layers}, "train": {"steps": steps},
            "eval": {"max_factor": max_factor, "samples": samples}, "task_params": {}}


def test_training_fields_come_before_evaluation_fields() -> None:
    long_run = config(steps=12000, layers=2, max_factor=1024, samples=32)
    others = [config(steps=3000, layers=4, max_factor=256, samples=16)]
    assert differences(long_run, others) == [
        "train.steps=12000", "arch.n_layers=2", "eval.max_factor=1024", "eval.samples=32"]
    assert short_label(differences(long_run, others), "-") == (
        "train.steps=12000, arch.n_layers=2, eval.max_factor=1024, +1 more")


def test_the_preset_leads_and_unset_fields_are_named() -> None:
    mine = config(steps=3000, layers=2, max_factor=8, samples=32, preset="quick")
    other = {**config(steps=3000, layers=2, max_factor=8, samples=32), "task_params": {"near_misses": 1}}
    assert differences(mine, [other]) == ["preset=quick", "task_params.near_misses=(unset)"]
    assert short_label([], "quick preset") == "quick preset"
