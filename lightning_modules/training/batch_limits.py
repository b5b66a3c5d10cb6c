"""Lightning's Trainer with its four `limit_*_batches` arguments declared integer-first, so that the CLI keeps
`--trainer.limit_val_batches 1` an integer: one batch.

Lightning reads an int as a batch count and a float as a fraction of the split, so 1 is one batch and 1.0 the
whole split. Its Trainer annotates these arguments `Optional[Union[int, float]]`, but `typing` caches unions
by equality, which ignores order: once anything imported earlier has built `Optional[Union[float, int]]`
(importing lightning does), the Trainer's annotation is that object, float first. jsonargparse tries the
union's members in order, so every number became a float and `1` silently evaluated the whole split.
`int | float | None` is not cached, keeps its order, and is what is declared here: `1` (or `8`) parses as
an int, `1.0` or `0.5` as a float, as Lightning's documentation reads them.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Trainer


class BatchLimitTrainer(Trainer):
    """Lightning's Trainer; only the annotations of the batch limits differ.

    Args:
        limit_train_batches: training batches per epoch: an int counts batches, a float is a fraction.
        limit_val_batches: validation batches per evaluation: an int counts batches (1 is one batch), a float
            is a fraction (1.0 is the whole split).
        limit_test_batches: test batches: an int counts batches, a float is a fraction.
        limit_predict_batches: prediction batches: an int counts batches, a float is a fraction.
        kwargs: the rest of Lightning's Trainer arguments.
    """

    def __init__(
        self,
        *,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches,
            limit_predict_batches=limit_predict_batches,
            **kwargs,
        )
