"""Tool workers: the search engine an agent calls during its rollout.

``SearchWorker`` holds a BM25 index (``loomrl.tools.SearchIndex``) over the corpus of a task or
of a JSONL file and answers batches of queries; several ranks split a batch between them. The
rollout calls it through ``loomrl.agentic.ToolCaller``, which bounds every call's wait.
"""

from __future__ import annotations

from typing import Any

from loomrl.tools import SearchIndex, ToolResult, load_corpus
from loomrl.worker import Worker, dispatch


class SearchWorker(Worker):
    stateless = True  # answers depend only on the queries and the corpus
    # Calls run side by side (a BM25 lookup only reads the index): one slow call that the
    # caller gave up on must not hold the next calls back until they time out too.
    max_concurrency = 4

    def __init__(
        self,
        task: dict[str, Any] | None = None,
        corpus_path: str | None = None,
        top_k: int = 2,
        doc_chars: int = 300,
    ):
        super().__init__()
        self.index = SearchIndex(load_corpus(task, corpus_path), k=top_k, doc_chars=doc_chars)
        self.queries = 0

    @dispatch("split")
    def search(self, queries: list[str]) -> list[ToolResult]:
        self.queries += len(queries)
        return self.index.search(list(queries))

    def documents(self) -> int:
        return len(self.index.docs)
