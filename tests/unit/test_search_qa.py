"""The generated search world, its questions and exact-match scoring; the BM25 tool over it."""

from __future__ import annotations

import json

import pytest

from loomrl.errors import ConfigError
from loomrl.tasks import make_task
from loomrl.tasks.search_qa import (
    SearchQATask,
    build_world,
    extract_answer,
    normalize_answer,
)
from loomrl.tools import NO_RESULTS, SearchIndex, load_corpus


@pytest.fixture(scope="module")
def task():
    return SearchQATask(people=300)


@pytest.fixture(scope="module")
def index(task):
    return SearchIndex(task.corpus(), k=2)


def test_world_is_a_function_of_its_seed():
    a, b = build_world(3, 50, 4, 3), build_world(3, 50, 4, 3)
    assert a == b and a != build_world(4, 50, 4, 3)
    assert len(a.people) == 50 and len(a.countries) == 4 and len(a.cities) == 12
    # Every name is used once: a document names one entity.
    names = list(a.people) + list(a.cities) + list(a.countries)
    assert len(set(names)) == len(names)


def test_every_answer_is_written_in_the_documents_the_question_needs(task):
    texts = {d["title"]: d["text"] for d in task.corpus()}
    kinds = set()
    for i in range(200):
        ex = task.train_item(i)
        kinds.add(ex.meta["kind"])
        doc = texts[ex.meta["person"]]
        assert ex.meta["person"] in ex.question
        if ex.meta["hops"] == 1:
            assert ex.answer in doc
        else:  # the person's city, then the city's country
            city = doc.rsplit("the city of ", 1)[1].rstrip(".")
            assert ex.answer not in doc and ex.answer in texts[city]
    assert kinds == {"city", "year", "profession", "country"}


def test_held_out_people_never_appear_in_training(task):
    held = {e.meta["person"] for e in task.eval_set()}
    assert len(task.eval_set()) == 64 and len(held) > 10
    assert not held & {task.train_item(i).meta["person"] for i in range(2000)}
    assert task.train_item(7) == task.train_item(7)
    assert SearchQATask(people=300, seed=1).train_item(7) != task.train_item(7)


def test_hops_select_the_question_kinds():
    one = SearchQATask(people=100, hops=1)
    two = SearchQATask(people=100, hops=2)
    assert {one.train_item(i).meta["hops"] for i in range(50)} == {1}
    assert {two.train_item(i).meta["kind"] for i in range(50)} == {"country"}


def test_task_config_errors_come_together():
    with pytest.raises(ConfigError) as e:
        SearchQATask(people=3, hops=5, eval_fraction=1.5)
    text = str(e.value)
    assert "hops: 5" in text and "people: must be >= 10" in text and "eval_fraction" in text
    with pytest.raises(ConfigError, match="did you mean 'people'"):
        make_task("search_qa", peeple=10)


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("<search> x </search> <answer> Drun </answer>", "Drun"),
        ("<answer> a </answer> then <answer>  b </answer>", "b"),
        ("<answer> open only", None),
        ("no tags", None),
        ("</answer> <answer> x", None),
        ("<answer> a <answer> b </answer>", "b"),
        ("<answer></answer>", ""),
        (None, None),
    ],
)
def test_the_last_complete_answer_is_read(text, parsed):
    assert extract_answer(text) == parsed


@pytest.mark.timeout(60)
def test_a_response_repeating_the_opening_tag_is_scored_in_linear_time(task):
    # Before, a regex scanned from every "<answer>" to the end: minutes for 500 KB of them.
    ex = task.train_item(0)
    r = task.score("<answer>" * 60_000, ex)
    assert (r.reward, r.malformed, r.reason) == (0.0, True, "no_answer")
    assert task.score("<answer>" * 60_000 + f" {ex.answer} </answer>", ex).correct


def test_exact_match_after_normalisation(task):
    ex = task.train_item(0)
    assert task.score(f"<answer> The {ex.answer.upper()}. </answer>", ex).reward == 1.0
    wrong = task.score("<answer> Nowhere </answer>", ex)
    assert wrong.reward == 0.0 and not wrong.malformed and wrong.reason == "wrong"
    missing = task.score(f"it is {ex.answer}", ex)
    assert missing.reward == 0.0 and missing.malformed and missing.reason == "no_answer"
    long = task.score("<answer> " + "x" * 500 + " </answer>", ex)
    assert long.malformed and long.reason == "too_long"
    assert normalize_answer("  An  Old, Town! ") == "old town"


def test_bm25_finds_the_person_asked_about(task, index):
    hits = 0
    for i in range(100):
        ex = task.train_item(i)
        (res,) = index.search([ex.question])
        hits += ex.answer in res.text if ex.meta["hops"] == 1 else 0
        assert res.ok and res.text.startswith("Doc 1")
    one_hop = sum(task.train_item(i).meta["hops"] == 1 for i in range(100))
    assert hits >= 0.9 * one_hop


def test_queries_that_match_nothing_get_no_results(index):
    res = index.search(["", "the of a", "qqqzzzx", "Drun"])
    assert [r.text for r in res[:3]] == [NO_RESULTS] * 3
    assert all(r.status == "ok" for r in res)


def test_jsonl_corpus_problems_are_listed_by_line(tmp_path):
    good = tmp_path / "c.jsonl"
    good.write_text(json.dumps({"title": "T", "text": "alpha beta"}) + "\n\n")
    assert load_corpus(path=str(good)) == [{"title": "T", "text": "alpha beta"}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "x"}\nnot json\n{"text": "fine"}\n')
    with pytest.raises(ConfigError) as e:
        load_corpus(path=str(bad))
    assert "bad.jsonl:1" in str(e.value) and "bad.jsonl:2: not JSON" in str(e.value)
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus(path=str(tmp_path / "none.jsonl"))
    with pytest.raises(ConfigError, match="no corpus of its own"):
        load_corpus(task={"name": "arithmetic"})


def test_jsonl_corpus_keeps_documents_whole_at_unicode_separators(tmp_path):
    docs = [{"title": "A", "text": "one\u2028two"}, {"title": "B", "text": "three\x85four"}]
    p = tmp_path / "u.jsonl"
    p.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), "utf-8")
    assert load_corpus(path=str(p)) == docs


def test_a_corpus_that_is_a_folder_or_not_utf8_is_named(tmp_path):
    with pytest.raises(ConfigError, match="is a directory; name a JSONL file"):
        load_corpus(path=str(tmp_path))
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"text": "one"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ConfigError, match=r"latin1.jsonl:2 is not UTF-8 text \(byte 0xe9\)"):
        load_corpus(path=str(bad))


def test_a_corpus_with_nothing_to_search_is_named():
    with pytest.raises(ConfigError, match="has no word to search"):
        SearchIndex([{"title": "", "text": "the of a"}, {"title": "B", "text": ""}])


def test_jsonl_corpus_titles_are_strings_or_null(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"title": null, "text": "alpha"}\n')
    assert load_corpus(path=str(p)) == [{"title": "", "text": "alpha"}]  # not "None"
    p.write_text('{"title": {"x": 1}, "text": "alpha"}\n')
    with pytest.raises(ConfigError, match='t.jsonl:1: "title" must be a string or null, got dict'):
        load_corpus(path=str(p))


@pytest.mark.parametrize("path", ["", "  "])
def test_an_empty_corpus_path_is_refused_not_read_as_unset(path):
    with pytest.raises(ConfigError, match="is empty; name a JSONL file"):
        load_corpus(task={"name": "search_qa", "people": 20}, path=path)


def test_jsonl_corpus_with_half_a_surrogate_pair_is_named(tmp_path):
    # Read as it is, the tokenizer would fail on the inserted result in the middle of a rollout.
    p = tmp_path / "s.jsonl"
    p.write_text('{"text": "fine \\ud83d\\ude00"}\n{"text": "broken \\ud800 here"}\n')
    with pytest.raises(ConfigError, match=r"s.jsonl:2: holds an unpaired surrogate escape"):
        load_corpus(path=str(p))
