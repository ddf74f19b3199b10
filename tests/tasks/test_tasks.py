"""Task generators (longmoe.tasks): answers really in (and only derivable from) the context, lengths,
rules, determinism."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from longmoe.tasks import FAMILIES, TASKS, TaskError, TaskItem, generate, parse_tasks


def _without_needles(item: TaskItem) -> str:
    rest = item.context
    for s in item.metadata["needles"]:
        assert s in rest, "every needle sentence is in the context verbatim"
        rest = rest.replace(s, "")
    return rest


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("length", [512, 2048])
def test_prompt_length_within_two_percent(tok, task, length):
    for item in generate(task, 3, length, seed=11, tokenizer=tok, depth=0.4):
        n = len(tok.encode(item.prompt()))
        assert abs(n - length) <= 0.02 * length, (task, n)
        assert item.metadata["n_tokens"] == n
        assert item.metadata["task"] == TASKS[task][0] and item.metadata["variant"] in TASKS[task][1]


@pytest.mark.parametrize("task", [t for t in TASKS if t not in ("multihop_count",)])
def test_answers_only_derivable_from_needles(tok, task):
    """Each answer occurs in the context, and no longer occurs once the needle sentences are removed."""
    for item in generate(task, 4, 1024, seed=3, tokenizer=tok):
        if item.metadata["variant"] == "count":  # a small count may occur in filler; tested below
            continue
        rest = _without_needles(item)
        for a in item.answers:
            assert re.search(rf"\b{re.escape(a)}\b", item.context), (task, a)
            assert not re.search(rf"\b{re.escape(a)}\b", rest), (task, a)


def test_count_matches_the_lines_in_context(tok):
    for item in generate("multihop_count", 6, 2048, seed=5, tokenizer=tok):
        target = item.metadata["target"]
        n = len(re.findall(rf"Delivery note \d+: a crate of {re.escape(target)} arrived", item.context))
        assert item.answers == [str(n)] and n >= 1
        assert target not in _without_needles(item)


def test_mostfreq_is_the_unique_maximum(tok):
    for item in generate("multihop_mostfreq", 6, 2048, seed=6, tokenizer=tok):
        goods = Counter(re.findall(r"Delivery note \d+: a crate of (\S+) arrived", item.context))
        (top, c1), (_, c2) = goods.most_common(2)
        assert c1 > c2 and item.answers == [top]


def test_chain_answers_are_exactly_the_variables_holding_the_value(tok):
    for item in generate("multihop_chain", 6, 2048, seed=7, tokenizer=tok):
        value = re.search(r"assigned the value (\d+)", item.question).group(1)
        direct = dict(re.findall(r"VAR (\w+) = (\d+)\.", item.context))
        refs = dict(re.findall(r"VAR (\w+) = VAR (\w+)\.", item.context))

        def resolve(v, refs=refs, direct=direct):
            while v in refs:
                v = refs[v]
            return direct.get(v)

        holding = {v for v in set(direct) | set(refs) if resolve(v) == value}
        assert holding == set(item.answers)
        assert len(item.answers) == item.metadata["hops"] + 1
        assert len(direct) == 2, "a decoy chain with another value is present"


_REPORT = re.compile(r"Report from the (.+?), dated (\d{4}-\d\d-\d\d): the (.+?) of (\w+) is (\d+)\.")


@pytest.mark.parametrize("variant", ["latest", "authority"])
def test_conflicts_resolve_to_the_documented_winner(tok, variant):
    for item in generate(f"conflict_{variant}", 8, 2048, seed=8, tokenizer=tok):
        place = item.metadata["place"]
        reports = [r for r in _REPORT.findall(item.context) if r[3] == place]
        assert len(reports) == item.metadata["n_conflicts"] >= 2
        assert len({r[4] for r in reports}) == len(reports), "the reports really disagree"
        latest = max(reports, key=lambda r: r[1])
        if variant == "latest":
            assert "most recent" in item.question
            assert item.answers == [latest[4]]
        else:
            authority = re.search(r"Only the (.+?) is authoritative", item.question).group(1)
            (winner,) = [r for r in reports if r[0] == authority]
            assert item.answers == [winner[4]]
            assert winner[4] != latest[4], "the authority rule must disagree with the latest-date rule"


def test_recall_answers_follow_the_question_order(tok):
    for item in generate("recall", 5, 2048, seed=9, tokenizer=tok):
        keys = re.search(r"locker codes of (.+)\?", item.question).group(1).split(", ")
        facts = dict(re.findall(r"the locker code of (\S+) is (\d+)\.", item.context))
        assert [facts[k] for k in keys] == item.answers


def test_depth_places_the_needle(tok):
    for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
        item = generate("niah_single", 1, 4096, seed=1, tokenizer=tok, depth=depth)[0]
        pos = item.context.index(item.metadata["needles"][0])
        assert abs(pos / len(item.context) - depth) < 0.05, depth
        assert item.metadata["depth"] == depth


def test_deterministic_and_seed_dependent(tok):
    a = [x.to_dict() for x in generate("niah", 4, 1024, seed=2, tokenizer=tok)]
    b = [x.to_dict() for x in generate("niah", 4, 1024, seed=2, tokenizer=tok)]
    c = [x.to_dict() for x in generate("niah", 4, 1024, seed=3, tokenizer=tok)]
    assert a == b and a != c
    assert [x.to_dict() for x in generate("niah", 2, 1024, seed=2, tokenizer=tok)] == a[:2], (
        "item i ignores n"
    )
    assert len({x["metadata"]["variant"] for x in a}) == 4, "a family cycles through its variants"


def test_item_json_roundtrip_and_rendering(tok):
    item = generate("conflict", 1, 512, seed=0, tokenizer=tok)[0]
    d = json.loads(json.dumps(item.to_dict()))
    back = TaskItem.from_dict(d)
    assert back == item
    assert item.prompt().startswith(item.context) and item.prompt().endswith("Answer:")
    assert item.to_text() == item.prompt() + " " + ", ".join(item.answers) + "\n"
    for k in ("length", "depth", "hops", "n_conflicts"):
        assert k in item.metadata
    with pytest.raises(TaskError, match="answers"):
        TaskItem.from_dict({"context": "", "question": ""})


def test_filler_is_real_varied_text(tok):
    item = generate("niah_single", 1, 4096, seed=4, tokenizer=tok)[0]
    lines = [ln for ln in _without_needles(item).splitlines() if ln.strip()]
    assert len(lines) > 10 and len(set(lines)) == len(lines), "no repeated filler paragraphs"
    words = re.findall(r"[a-z]+", item.context.lower())
    assert Counter(words).most_common(1)[0][1] < 0.1 * len(words)


def test_task_names_derive_from_the_family_registry():
    """TASKS is every family plus one ``family_variant`` name per variant of the FAMILIES registry."""
    assert list(FAMILIES) == ["niah", "multihop", "conflict", "recall"]
    expected = {f: (f, m.VARIANTS) for f, m in FAMILIES.items()}
    expected |= {f"{f}_{v}": (f, (v,)) for f, m in FAMILIES.items() for v in m.VARIANTS}
    assert expected == TASKS


def test_bad_requests_have_clear_errors(tok):
    with pytest.raises(TaskError, match="unknown task 'nope'"):
        generate("nope", 1, 512, 0, tok)
    with pytest.raises(TaskError, match="depth"):
        generate("niah", 1, 512, 0, tok, depth=1.5)
    with pytest.raises(TaskError, match="too short"):
        generate("conflict", 1, 64, 0, tok)
    with pytest.raises(TaskError, match="unknown task 'x'"):
        parse_tasks("niah,x")
    assert parse_tasks("niah, recall") == ["niah", "recall"]
