"""Tools an agent calls during a rollout: a BM25 search engine over a document corpus.

``SearchIndex`` ranks documents with bm25s (Okapi BM25, English stop words removed) and formats
the top hits as the text an agent reads. ``load_corpus`` gets the documents from a task that
generates its own (``search_qa``) or from a JSONL file of ``{"title", "text"}`` lines. A query
that finds nothing (empty, or only stop words) gets a "no results" text, never an error: what a
model writes into its search tag is not to be trusted.

This module never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loomrl.config import read_utf8
from loomrl.errors import ConfigError, LoomError

NO_RESULTS = "No results."


class ToolError(LoomError):
    """A tool failed on several calls in a row (timed out, raised or its worker died)."""


@dataclass(frozen=True)
class ToolResult:
    """What one tool call gave back: the text the agent reads, and how the call went.

    ``status``: "ok", "timeout" (no reply within the rollout's limit) or "error" (the tool
    raised, or its worker is gone); a failed call's text says so, for the agent to read.
    """

    text: str
    status: str = "ok"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def load_corpus(
    task: dict[str, Any] | None = None, path: str | None = None
) -> list[dict[str, str]]:
    """Documents from a JSONL file (``path``), else from the task built from ``task`` (its
    ``corpus()``). Every problem with the file is reported at once, by line."""
    if path is not None:
        if not path.strip():  # Path("") is the working directory
            raise ConfigError(
                [
                    f"corpus_path: {path!r} is empty; name a JSONL file, or leave it out (null) "
                    "to search the task's own corpus"
                ]
            )
        p = Path(path)
        if not p.exists():
            raise ConfigError([f"corpus_path: {path!r} does not exist"])
        if not p.is_file():
            raise ConfigError([f"corpus_path: {path!r} is a directory; name a JSONL file"])
        try:
            text = read_utf8(p)
        except ValueError as e:
            where, byte = e.args
            raise ConfigError([f"corpus_path: {where} is not UTF-8 text ({byte})"]) from None
        docs, problems = [], []
        from loomrl.tasks.jsonl import jsonl_lines

        for n, line in enumerate(jsonl_lines(text), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(f"{path}:{n}: not JSON ({e.msg})")
                continue
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                problems.append(f'{path}:{n}: needs a "text" string (and optionally "title")')
                continue
            title = row.get("title")
            # str() would make a null title the word "None", which the agent then reads.
            if title is not None and not isinstance(title, str):
                problems.append(
                    f'{path}:{n}: "title" must be a string or null, got {type(title).__name__}'
                )
                continue
            try:  # JSON may escape half a surrogate pair ("\ud800"), which no tokenizer takes
                (row["text"] + (title or "")).encode("utf-8")
            except UnicodeEncodeError as e:
                problems.append(
                    f"{path}:{n}: holds an unpaired surrogate escape "
                    f"({e.object[e.start]!r}); write the character itself, or its pair"
                )
                continue
            docs.append({"title": title or "", "text": row["text"]})
        if problems:
            raise ConfigError(
                problems[:20] + ([f"... {len(problems) - 20} more"] * (len(problems) > 20))
            )
        if not docs:
            raise ConfigError([f"corpus_path: {path!r} holds no documents"])
        return docs
    from loomrl.tasks import make_task

    built = make_task(**(task or {}))
    corpus = getattr(built, "corpus", None)
    if corpus is None:
        raise ConfigError(
            [
                f"task {built.name!r} has no corpus of its own: set agent.corpus_path to a JSONL "
                'file of {"title", "text"} lines'
            ]
        )
    return corpus()


class SearchIndex:
    """BM25 (bm25s) over ``docs``; ``search`` returns the formatted top ``k`` per query."""

    def __init__(self, docs: list[dict[str, str]], k: int = 3, doc_chars: int = 300):
        import bm25s

        if not docs:
            raise ConfigError(["the search corpus is empty"])
        if k < 1:
            raise ConfigError([f"top_k: must be >= 1 document per search, got {k}"])
        self.docs, self.k, self.doc_chars = docs, k, doc_chars
        self._bm25s = bm25s
        self.retriever = bm25s.BM25()
        tokens = bm25s.tokenize([d["text"] for d in docs], stopwords="en", show_progress=False)
        if not tokens.vocab:  # bm25s fails on an empty vocabulary with a bare ValueError
            raise ConfigError(
                [
                    f"the search corpus ({len(docs)} documents) has no word to search: every "
                    "text is empty or only English stop words; give documents with content"
                ]
            )
        self.retriever.index(tokens, show_progress=False)

    def hits(self, queries: list[str]) -> list[list[int]]:
        """Indices of the top documents of every query, best first (empty: nothing matched)."""
        bm25s = self._bm25s
        tokens = bm25s.tokenize(list(queries), stopwords="en", show_progress=False)
        out: list[list[int]] = [[] for _ in queries]
        # A query with no known word has no ids: BM25 would score every document 0.
        asked = [i for i, ids in enumerate(tokens.ids) if ids]
        if not asked:
            return out
        sub = bm25s.tokenization.Tokenized(ids=[tokens.ids[i] for i in asked], vocab=tokens.vocab)
        k = min(self.k, len(self.docs))
        found, scores = self.retriever.retrieve(sub, k=k, show_progress=False, n_threads=1)
        for row, i in enumerate(asked):
            out[i] = [int(d) for d, s in zip(found[row], scores[row], strict=True) if s > 0]
        return out

    def format(self, doc_ids: list[int]) -> str:
        if not doc_ids:
            return NO_RESULTS
        parts = []
        for n, d in enumerate(doc_ids, 1):
            doc = self.docs[d]
            text, title = doc["text"][: self.doc_chars], doc.get("title", "")
            # A title the text opens with would only repeat its first words.
            named = title and not text.startswith(title)
            parts.append(f"Doc {n} ({title}): {text}" if named else f"Doc {n}: {text}")
        return " ".join(parts)

    def search(self, queries: list[str]) -> list[ToolResult]:
        return [ToolResult(self.format(ids)) for ids in self.hits(queries)]
