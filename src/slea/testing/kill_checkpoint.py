"""A plugin module that SIGKILLs its own process inside one checkpoint, for the resume tests.

``plugins: [slea.testing.kill_checkpoint]`` with ``$SLEA_TEST_KILL_AT=N``: when
:func:`slea.runs.checkpoint.save_checkpoint` writes the checkpoint of step ``N`` (counted from 0: an iteration of
the single-agent trainer, a single-agent update of the team trainer; its folder is ``iter_<N + 1>``), the process
kills itself after every file of it is written and fsynced, before the folder is renamed into place, so a half-done
``.tmp-iter_<N + 1>`` is left behind and the previous checkpoint is the newest intact one. Without ``$SLEA_TEST_KILL_AT`` it does nothing, so a
resumed process (same config, same plugin) runs on. Nothing in slea imports it.
"""

from __future__ import annotations

import os
import signal

from slea.runs import checkpoint

AT = os.environ.get("SLEA_TEST_KILL_AT")
if AT is not None:
    _real_save, _real_fsync, _armed = checkpoint.save_checkpoint, checkpoint._fsync, []

    def _save_checkpoint(root, iteration, *args, **kwargs):
        if iteration == int(AT):
            _armed.append(iteration)
        return _real_save(root, iteration, *args, **kwargs)

    def _fsync(path):
        _real_fsync(path)
        if _armed and path.name.startswith(".tmp-"):  # the folder itself, after all its files
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoint.save_checkpoint, checkpoint._fsync = _save_checkpoint, _fsync
