"""``streamrl.train``: learners, the loop, checkpoints, SFT, comparisons.

The package is also the synchronous entry point ``streamrl.train(config, out, ...)``
(``streamrl.api.train``): a module named ``train`` and a function named ``train`` cannot both be
an attribute of ``streamrl``, so the package itself is callable.
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from streamrl.api import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
