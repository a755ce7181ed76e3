"""The progress bar ``show_progress=True`` shows while an index embeds, as LlamaIndex's own indexes do."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from memtree.model_calls import embedding_progress

DESCRIPTION = "Generating embeddings"
"""The bar's label: the one ``VectorStoreIndex.from_documents(show_progress=True)`` shows."""


@contextlib.contextmanager
def embedding_bar(show: bool, texts: int) -> Iterator[None]:
    """A tqdm bar (``tqdm.auto``, as LlamaIndex's ``get_tqdm_iterable``) over the
    ``texts`` that the block embeds, moved after each embedding call the memory makes.

    The nodes' own texts are embedded first; the summaries the tree then writes are
    embedded too, but do not move the bar past ``texts``. Nothing is shown when
    ``show`` is false, when there is nothing to embed, or when tqdm is missing."""
    if not show or texts <= 0:
        yield
        return
    try:
        from tqdm.auto import tqdm
    except ImportError:
        yield
        return
    with tqdm(total=texts, desc=DESCRIPTION) as bar:

        def advance(count: int) -> None:
            bar.update(max(0, min(count, texts - bar.n)))

        with embedding_progress(advance):
            yield
