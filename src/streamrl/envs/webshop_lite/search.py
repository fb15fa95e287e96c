"""Product search with BM25 (the ``bm25s`` library, Lucene's variant and pyserini's k1=0.9, b=0.4).

Documents are a product's title, bullet points, attributes and description; WebShop's Lucene
index returns the top 50 hits, shown 10 to a page. Ties keep catalogue order, so a query always
gives the same ranking.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from streamrl.envs.webshop_lite.catalog import DEFAULT_SEED, build_catalog

TOP_N = 50
PER_PAGE = 10
_TOKEN = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    "a an and are as at be but by for from has have i i'm if in into is it its me my need no not of on or "
    "such that the their then there these they this to want was will with would you your looking find like "
    "lower than price dollars am".split()
)


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


class SearchEngine:
    """BM25 over one catalogue."""

    def __init__(self, documents: list[str], asins: list[str]):
        try:
            import bm25s
        except ImportError as error:  # pragma: no cover - bm25s is a core dependency
            raise ImportError(f"webshop_lite needs the 'bm25s' package for search ({error}); pip install bm25s") from error
        self.asins = asins
        self._retriever = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
        self._retriever.index([tokenize(d) or ["<empty>"] for d in documents], show_progress=False)
        self._vocab = self._retriever.vocab_dict

    def scores(self, query: str) -> np.ndarray:
        tokens = [t for t in tokenize(query) if t in self._vocab]
        if not tokens:
            return np.zeros(len(self.asins), dtype=np.float32)
        return np.asarray(self._retriever.get_scores(tokens), dtype=np.float32)

    def search(self, query: str, top_n: int = TOP_N) -> list[str]:
        """The ASINs of the top ``top_n`` products with a positive score, best first."""
        scores = self.scores(query)
        hits = np.flatnonzero(scores > 0)
        order = hits[np.lexsort((hits, -scores[hits]))]  # score descending, then catalogue order
        return [self.asins[i] for i in order[:top_n]]


def document(product: dict) -> str:
    return " ".join([product["Title"], *product["BulletPoints"], *product["Attributes"], product["Description"]])


@lru_cache(maxsize=4)
def search_engine(seed: int = DEFAULT_SEED) -> SearchEngine:
    catalog = build_catalog(seed)
    return SearchEngine([document(p) for p in catalog.products], [p["asin"] for p in catalog.products])
