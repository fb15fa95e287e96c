"""The base of every configuration section (``training/config.py``, ``training/algo_config.py``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


#: a float that a boolean never coerces into (``true`` would otherwise read as 1.0); counts are
#: ``StrictInt`` for the same reason (``train.steps=true`` is an error, not 1 step)
Float = Annotated[float, BeforeValidator(_not_bool)]
#: the largest learning rate accepted anywhere: far above any useful one, low enough that a typo
#: (``1e30``, ``.inf``) is refused before training instead of turning every weight into NaN
MAX_LR = 1.0


class Section(BaseModel):
    #: no NaN or infinity anywhere (a null disables what can be disabled)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
