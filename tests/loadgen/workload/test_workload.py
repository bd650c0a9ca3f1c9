from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from kvwatch.loadgen.workload.spec import (
    DatasetError,
    LengthDist,
    load_dataset,
    parse_length,
    synthetic_items,
)


class TestLengths:
    def test_parse(self) -> None:
        assert parse_length("300") == LengthDist("fixed", 300)
        assert parse_length("uniform:100,300") == LengthDist("uniform", 100, 300)
        assert parse_length("lognormal:200,0.5").kind == "lognormal"

    @pytest.mark.parametrize("spec", ["", "abc", "uniform:5", "uniform:9,3", "normal:-1,2",
                                      "poisson:3", "fixed:0"])  # fmt: skip
    def test_bad(self, spec: str) -> None:
        with pytest.raises(DatasetError, match="length"):
            parse_length(spec)

    def test_samples_in_range_and_positive(self) -> None:
        rng = random.Random(0)
        u = [parse_length("uniform:10,20").sample(rng) for _ in range(500)]
        assert min(u) >= 10 and max(u) <= 20
        n = [parse_length("normal:5,50").sample(rng) for _ in range(500)]
        assert min(n) >= 1


class TestSynthetic:
    def test_exact_token_lengths_with_a_tokenizer(self) -> None:
        tokens = list(range(1000, 1500))
        items = list(itertools.islice(
            synthetic_items(parse_length("uniform:5,900"), parse_length("7"), 1, tokens), 50
        ))  # fmt: skip
        for it in items:
            assert it.token_ids is not None and len(it.token_ids) == it.input_tokens
            assert it.max_tokens == 7
        assert len({it.token_ids for it in items}) == 50

    def test_seeded(self) -> None:
        a = list(itertools.islice(synthetic_items(parse_length("20"), parse_length("5"), 3), 5))
        b = list(itertools.islice(synthetic_items(parse_length("20"), parse_length("5"), 3), 5))
        assert a == b and a[0].token_ids is None and a[0].text

    def test_shared_prefix(self) -> None:
        tokens = list(range(100, 400))
        items = list(itertools.islice(synthetic_items(
            parse_length("10"), parse_length("5"), 0, tokens, shared_prefix=50, prefix_groups=2,
        ), 6))  # fmt: skip
        assert all(it.input_tokens == 60 and len(it.token_ids or ()) == 60 for it in items)
        heads = [it.token_ids[:50] for it in items if it.token_ids]
        assert heads[0] == heads[2] == heads[4] and heads[1] == heads[3] and heads[0] != heads[1]

    def test_bodies(self) -> None:
        it = next(synthetic_items(parse_length("4"), parse_length("3"), 0, list(range(50))))
        comp = it.body("m", chat=False, ignore_eos=True)
        assert comp["prompt"] == list(it.token_ids or ()) and comp["ignore_eos"] is True
        chat = it.body("m", chat=True, ignore_eos=False)
        assert chat["messages"][0]["role"] == "user" and "ignore_eos" not in chat


class TestDatasets:
    def test_sharegpt_json_and_jsonl(self, tmp_path: Path) -> None:
        conv = {"conversations": [{"from": "human", "value": "hi there"},
                                  {"from": "gpt", "value": " ".join(["w"] * 13)}]}  # fmt: skip
        f = tmp_path / "sg.json"
        f.write_text(json.dumps([conv, {"conversations": []}, conv]))
        items = load_dataset(f, None)
        assert len(items) == 2 and items[0].text == "hi there" and items[0].max_tokens == 17
        g = tmp_path / "sg.jsonl"
        g.write_text(json.dumps(conv) + "\n\n" + json.dumps(conv) + "\n")
        assert len(load_dataset(g, parse_length("9"))) == 2
        assert load_dataset(g, parse_length("9"))[0].max_tokens == 9

    def test_custom_jsonl(self, tmp_path: Path) -> None:
        f = tmp_path / "c.jsonl"
        f.write_text('{"prompt": "a", "max_tokens": 4}\n{"prompt": "b", "max_tokens": 2}\n')
        assert [(i.text, i.max_tokens) for i in load_dataset(f, None)] == [("a", 4), ("b", 2)]

    @pytest.mark.parametrize(
        ("content", "why"),
        [
            ('{"prompt": "a", "max_tokens": 2}\n{"prompt": \n', ":2: not valid JSON"),
            ('{"prompt": "a", "max_tokens": -3}\n', "max_tokens must be a positive"),
            ('{"prompt": "a"}\n', "give --output-len"),
            ('{"text": "nothing we know"}\n', "no usable records"),
            ("", "no usable records"),
            ("[1, 2", "not valid JSON"),
        ],
    )
    def test_bad_files_fail_before_the_run(self, tmp_path: Path, content: str, why: str) -> None:
        f = tmp_path / "bad.jsonl"
        f.write_text(content)
        with pytest.raises(DatasetError, match=why):
            load_dataset(f, None)

    def test_missing_and_binary(self, tmp_path: Path) -> None:
        with pytest.raises(DatasetError, match="cannot read"):
            load_dataset(tmp_path / "nope.jsonl", None)
        b = tmp_path / "bin.jsonl"
        b.write_bytes(b"\xff\xfe\x00")
        with pytest.raises(DatasetError, match="not UTF-8"):
            load_dataset(b, None)


@pytest.mark.parametrize("spec", ["nan", "inf", "uniform:1,inf", "lognormal:nan,0.5", "-inf"])
def test_lengths_that_are_not_finite_are_refused(spec: str) -> None:
    """`--input-len nan` became a length of 1, `inf` a traceback and `--think-time inf` a run
    that never ended."""
    from kvwatch.loadgen.workload.lengths import DatasetError, parse_length

    with pytest.raises(DatasetError):
        parse_length(spec)


@pytest.mark.parametrize("args", [("--requests", "-3"), ("--requests", "0"), ("--duration", "0"),
                                  ("--duration", "nan")])  # fmt: skip
def test_counts_and_durations_are_refused_where_they_enter(args: tuple[str, ...]) -> None:
    """`--requests -3` replayed 7 of 10 trace rows; 0 or -3 sent nothing and exited 0."""
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", "http://127.0.0.1:9",
         "--rate", "1", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and args[0] in p.stderr and "Traceback" not in p.stderr
