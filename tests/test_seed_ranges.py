"""Train / validation / test seed ranges are pairwise disjoint, checked on the functions that draw the
seeds: MQAR rows (training steps, validation rows for early stop and lr choice, test rows for the
reported accuracy), agent task seeds (SFT demonstrations, RL training tasks, the validation block for
the RL lr, the held-out test tasks) and vision renders (training pages, the validation pages of the
text control's lr choice, held-out test pages)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from longmoe.envs import make_env
from longmoe.envs.seeds import TEST_SEEDS, TRAIN_SEEDS, VALIDATION_SEEDS, validation_offset
from longmoe.eval.agent.harness import held_out_seeds as agent_test_seeds
from longmoe.pipelines.agent.config import AgentRecipeConfig
from longmoe.pipelines.mqar import seeds as mq
from longmoe.pipelines.mqar.__main__ import load_config, parse_args
from longmoe.pipelines.mqar.config import CONFIG_FILE, SweepConfig
from longmoe.pipelines.vision_extract.config import VisionExtractConfig, quick
from longmoe.pipelines.vision_extract.control import validation_seeds as vision_validation_seeds
from longmoe.pipelines.vision_extract.data import train_seed as vision_train_seed
from longmoe.pipelines.vision_extract.train import CURVE_OFFSET
from longmoe.rl.trainer import task_seeds
from longmoe.tasks.documents import HELD_OUT_SEED_BASE as DOC_BASE
from longmoe.tasks.documents import held_out_seeds as doc_held_out_seeds
from longmoe.tasks.mqar import mqar
from longmoe.train.sft import SFTData


def _disjoint(*ranges: range) -> bool:
    rs = sorted(ranges, key=lambda r: r.start)
    return all(a.stop <= b.start for a, b in zip(rs, rs[1:]))


@pytest.mark.parametrize("rc", [SweepConfig.load(CONFIG_FILE), load_config(parse_args(["--quick"]))])
def test_mqar_train_validation_test_rows_are_disjoint(rc):
    train = mq.train_range(rc.seeds, rc.steps)
    assert _disjoint(train, mq.validation_range(), mq.test_range())
    assert mq.test_range().stop <= mq.SEED_LIMIT, "torch keeps 32 bits of a seed: larger ones alias"
    assert all(mq.train_seed(s, t) in train for s in rc.seeds for t in (0, rc.steps - 1))
    assert all(mq.validation_seed(n) in mq.validation_range() for n in rc.eval_lengths)
    assert all(mq.test_seed(n) in mq.test_range() for n in rc.eval_lengths)
    seeds = [s for s in rc.seeds if s != rc.seeds[-1]]  # a cell seed's steps stop before the next's
    assert all(mq.train_seed(s, rc.steps - 1) < mq.train_seed(s + 1, 0) for s in seeds)


def test_mqar_long_rows_are_test_rows_apart_from_the_sweeps_and_each_other():
    """The long-row stage's rows lie in the test range, never on a sweep test row, one band per placement."""
    from longmoe.tasks.mqar import PLACEMENTS

    assert mq.LONG_PLACEMENTS == PLACEMENTS
    seeds = {(n, p): mq.long_test_seed(n, p) for n in (64, 4096, mq.MAX_LONG_LEN) for p in PLACEMENTS}
    assert len(set(seeds.values())) == len(seeds) and all(s in mq.test_range() for s in seeds.values())
    assert not set(seeds.values()) & {mq.test_seed(n) for n in range(1, 1 << 16)}
    with pytest.raises(ValueError, match="seq_len"):
        mq.long_test_seed(mq.MAX_LONG_LEN + 1, "near")


def test_mqar_validation_and_test_rows_share_no_row():
    rc = load_config(parse_args(["--quick"]))
    p, n = rc.pairs[0], rc.train_len
    val, test = (
        mqar(s, 64, rc.vocab_size, n, p, rc.alpha).input_ids for s in (mq.validation_seed(n), mq.test_seed(n))
    )
    assert not {tuple(r.tolist()) for r in val} & {tuple(r.tolist()) for r in test}


def test_agent_sft_rl_validation_test_seeds_are_disjoint():
    assert _disjoint(TRAIN_SEEDS, TEST_SEEDS, VALIDATION_SEEDS)
    cfg = AgentRecipeConfig()
    rl = [s for step in range(cfg.rl["steps"]) for s in task_seeds(cfg.seed, step, cfg.rl["tasks_per_step"])]
    assert all(s in TRAIN_SEEDS for s in rl)
    env = make_env(cfg.env, horizon=1, **cfg.env_args)
    fake = SimpleNamespace(seed=cfg.seed, sft=SimpleNamespace(envs={cfg.env: 1.0}, horizons=[1]),
                           env=lambda _name, _h: env)  # fmt: skip
    demos = []
    for i in range(20):  # the real code that draws them; the env keeps the seed it was reset with
        SFTData.demonstration(fake, i)
        demos.append(env.seed)
    assert all(s in TRAIN_SEEDS for s in demos) and len(set(demos)) == 20
    test = agent_test_seeds(cfg.eval_episodes, cfg.seed)
    val = agent_test_seeds(cfg.val_episodes, validation_offset(cfg.seed))
    assert all(s in TEST_SEEDS for s in test) and all(s in VALIDATION_SEEDS for s in val)


@pytest.mark.parametrize("rc", [VisionExtractConfig(), quick()])
def test_vision_training_pages_never_reach_held_out_pages(rc):
    train_steps = range(rc.steps + rc.pretrain_steps + 10_000_001)
    # train_seed wraps below the base: the extremes of every (step, row) it can see
    for step in (0, 1, rc.steps - 1, 10_000_000 + rc.pretrain_steps, train_steps.stop - 1):
        seeds = [vision_train_seed(rc.seed, step, rc.batch_size, i) for i in range(rc.batch_size)]
        assert all(0 <= s < DOC_BASE for s in seeds)
    evals = set(doc_held_out_seeds(max(rc.eval_count(f) for f in rc.eval_families), 0))
    curve = set(doc_held_out_seeds(rc.curve_n, CURVE_OFFSET))
    assert min(evals | curve) >= DOC_BASE, "held-out pages start at the base"
    assert not evals & curve, "the training-curve probe never reads the final test pages"
    # the text control's lr is chosen on validation pages: disjoint from training and test pages
    val = vision_validation_seeds(rc)
    test = range(DOC_BASE, DOC_BASE + CURVE_OFFSET + rc.curve_n)
    assert _disjoint(range(0, DOC_BASE), test, val)
    assert all(s in VALIDATION_SEEDS for s in (val.start, val.stop - 1))
    assert max(evals | curve) < TEST_SEEDS.stop
