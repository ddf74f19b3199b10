"""The agent recipe: pretrain a tiny model, SFT on expert tool use, RL; held-out success by horizon.

``python -m longmoe.pipelines.agent [--quick] [--run-dir DIR]``; see ``run.py``.
"""
