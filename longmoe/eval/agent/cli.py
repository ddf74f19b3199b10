"""``longmoe eval agent`` (or ``longmoe eval --tasks agent``): episode success by horizon on the tool
environments.

Examples::

    longmoe eval agent --model runs/sft --envs doclookup,calculator --horizons 1,2,4 --n 100
    longmoe eval agent --expert --envs doclookup --horizons 1,2,4,8   # the reference run
    longmoe eval agent --suite long --base-url http://127.0.0.1:8000/v1 --n 20   # horizons 8-32, SQL
    longmoe eval agent --base-url https://api.openai.com/v1 --api-model gpt-4o-mini \\
        --api-key-env OPENAI_API_KEY --envs calculator --horizons 1,2,4,8 --n 50

A local model is evaluated through RL's batched rollouts in the engine (``eval.agent.local``:
greedy, every episode at once, each keeping its cache across turns); an endpoint through its
function-calling API (``EndpointAgent``, ``--concurrency`` episodes at a time). Writes
``OUT/agent_episodes.jsonl``, ``OUT/agent_summary.{json,md}`` and
``OUT/plots/agent_success_by_horizon.png``. ``--expert`` plays the environments' scripted expert
instead of a model: success 1.0 by construction, so it checks the setup and shows how long the
episodes get (tokens counted with the tokenizer ``--tokenizer`` names, which it requires).
"""

from __future__ import annotations

import argparse
import os
import threading
from typing import Any

from tqdm import tqdm

from longmoe.checkpoint import TOKENIZER_FILE
from longmoe.data.tokenizer import Tokenizer
from longmoe.envs import ENVS, EnvConfigError, env_config, make_env
from longmoe.envs.suites import SUITES, suite_cells
from longmoe.eval.agent.harness import (
    EnvFactory,
    EpisodeResult,
    markdown_agent,
    run_agent_eval,
    write_agent_summary,
)
from longmoe.eval.agent.local import run_local_eval
from longmoe.eval.agent.policies import AgentPolicy, EndpointAgent, ExpertAgent
from longmoe.eval.args import add_backend_arguments, add_count_arguments, add_output_arguments
from longmoe.eval.clients import LOCAL_MAX_CONTEXT, PREFILL_CHUNK
from longmoe.eval.errors import EvalError, check_positive
from longmoe.eval.plots import plot_run
from longmoe.serve.engine import Engine

DEFAULT_AGENT_MAX_TOKENS = 256  # per assistant turn


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``longmoe eval agent``'s options."""
    add_backend_arguments(p)
    add_count_arguments(
        p.add_argument_group("episodes"), batch=False, n_help="episodes per (env, horizon) cell"
    )
    add_output_arguments(p)
    add_agent_arguments(p)


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("agent tasks (longmoe eval agent, or --tasks agent)")
    g.add_argument(
        "--envs",
        default=None,
        help=f"environments, comma-separated (default: all: {','.join(ENVS)}; with --suite, the suite's)",
    )
    g.add_argument(
        "--horizons",
        default=None,
        help="task horizons to score, e.g. 1,2,4,8 (default 1,2,4; with --suite, the suite's: 8,16,32)",
    )
    g.add_argument(
        "--suite",
        choices=sorted(SUITES),
        help="a named task suite (longmoe/envs/suites.py): 'long' = doclookup (2,000-character pages), "
        "calculator and sql at horizons 8, 16, 32 with distractors, corrections and capped tool results; "
        "--envs, --horizons and --env-opt narrow or override it",
    )
    g.add_argument(
        "--env-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment config field (integer) for every env that has it, e.g. page_chars=2000",
    )
    g.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="episodes played at once (default 8; a local engine batches them)",
    )
    g.add_argument(
        "--expert", action="store_true", help="play the scripted expert instead of a model (a reference run)"
    )
    g.add_argument(
        "--api-key-env", help="environment variable holding the endpoint's key (default OPENAI_API_KEY)"
    )


def _cells(args: argparse.Namespace) -> dict[tuple[str, int], EnvFactory]:
    """``(env, horizon) -> factory``; bad names, horizons or options raise ``EnvConfigError``."""
    suite = getattr(args, "suite", None)
    envs_arg = args.envs if args.envs is not None else ("" if suite else ",".join(ENVS))
    names = [e.strip() for e in envs_arg.split(",") if e.strip()]
    try:
        horizons = [int(h) for h in (args.horizons or ("" if suite else "1,2,4")).split(",") if h.strip()]
    except ValueError:
        raise EnvConfigError(
            f"--horizons {args.horizons!r} is invalid: expected integers like 1,2,4"
        ) from None
    opts: dict[str, int] = {}
    for kv in args.env_opt:
        key, sep, value = kv.partition("=")
        if not sep or not value.lstrip("-").isdigit():
            raise EnvConfigError(f"--env-opt {kv!r} is invalid: expected KEY=INTEGER")
        opts[key] = int(value)
    unused = set(opts)
    cells: dict[tuple[str, int], EnvFactory] = {}
    if suite:
        for (name, h), fields in suite_cells(suite, names or None, horizons or None).items():
            mine = {k: v for k, v in opts.items() if k in ENVS[name].config.__dataclass_fields__}
            unused -= set(mine)
            env_config(name, **{**fields, **mine})  # validate now, not in a worker thread
            cells[(name, h)] = _factory(name, {**fields, **mine})
        names = []
    for name in names:
        if name not in ENVS:
            raise EnvConfigError(f"--envs: environment {name!r} is unknown: expected one of {sorted(ENVS)}")
        known = set(ENVS[name].config.__dataclass_fields__)
        mine = {k: v for k, v in opts.items() if k in known}
        unused -= set(mine)
        for h in horizons:
            env_config(name, **mine, horizon=h)  # validate now, not in a worker thread
            cells[(name, h)] = _factory(name, {**mine, "horizon": h})
    if unused:
        raise EnvConfigError(f"--env-opt: no selected environment has field(s) {sorted(unused)}")
    return cells


def _factory(name: str, values: dict[str, Any]) -> EnvFactory:
    return lambda: make_env(name, **values)


def run(args: argparse.Namespace) -> int:
    """Play and score the episodes; a bad flag raises ``EvalError`` (or ``EnvConfigError``)."""
    if sum((args.model is not None, args.endpoint is not None, args.expert)) != 1:
        raise EvalError("give exactly one of --model DIR, --endpoint URL or --expert")
    check_positive("--n", args.n)
    check_positive("--concurrency", args.concurrency)
    cells = _cells(args)
    policy: AgentPolicy | None = None
    engine: Engine | None = None
    try:
        if args.expert:
            path = args.tokenizer
            if path is None:
                raise EvalError("--expert needs --tokenizer FILE|DIR to count the episodes' tokens")
            path = path / TOKENIZER_FILE if path.is_dir() else path
            tok = Tokenizer.from_file(path)
            policy = ExpertAgent(tok)
        elif args.endpoint is not None:
            key = args.api_key or os.environ.get(args.api_key_env or "OPENAI_API_KEY")
            if args.api_key_env and not key:
                raise EvalError(f"--api-key-env {args.api_key_env}: the variable is not set")
            policy = EndpointAgent(args.endpoint, args.api_model or "", api_key=key, timeout=args.timeout)
        else:
            engine = Engine.from_dir(
                args.model,
                device=args.device,
                max_context=LOCAL_MAX_CONTEXT,
                prefill_chunk=PREFILL_CHUNK,
                quantize=args.quantize,
            )
    except EvalError:
        raise
    except ValueError as e:
        raise EvalError(str(e)) from e
    name = policy.name if policy is not None else str(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    n_eps = len(cells) * args.n
    print(f"eval agent: {name}: {len(cells)} (env, horizon) cells x n={args.n} = {n_eps} episodes")
    bar = tqdm(total=n_eps, desc="episodes", unit="ep", disable=args.no_progress, dynamic_ncols=True)
    lock = threading.Lock()

    def tick(done: EpisodeResult | list[EpisodeResult]) -> None:
        with lock:
            bar.update(len(done) if isinstance(done, list) else 1)

    max_tokens = args.max_tokens or DEFAULT_AGENT_MAX_TOKENS
    try:
        if engine is not None:
            results = run_local_eval(engine, cells, args.n, args.out, args.seed, max_tokens, progress=tick)
        else:
            assert policy is not None
            results = run_agent_eval(
                policy, cells, args.n, args.out, args.seed, max_tokens, args.concurrency, progress=tick
            )
    finally:
        bar.close()
        (engine or policy).close()
    summary = write_agent_summary(results, args.out, name)
    print(markdown_agent(summary))
    if not args.no_plots:
        for p in plot_run(args.out):
            print(f"wrote {p}")
    print(f"results in {args.out}")
    return 0
