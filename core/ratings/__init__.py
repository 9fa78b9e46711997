"""Compare mode: the same prompt to several backends, blind votes, and what the votes say."""

import os


def one_blas_thread() -> None:
    """Keep numpy's matrix products on the calling thread (OPENBLAS_NUM_THREADS=1, unless set).

    The ratings' fits are many small, skinny products. On a machine whose cores are busy with
    the engines (the embedded model uses every core) OpenBLAS's own thread pool only waits for
    them: measured on 2 busy cores, the controlled fit of 2,000 votes took ~0.9 s with it and
    ~0.2 s without. It must run before numpy is first imported (app.py and `python -m core.ratings`
    call it first); nothing else in the app leans on BLAS.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
