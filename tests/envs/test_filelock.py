"""file_lock: one holder at a time, across threads (each call opens its own file description)."""

from __future__ import annotations

import threading

from slea.envs.filelock import file_lock


def test_second_holder_waits_for_the_first(tmp_path):
    lock = tmp_path / "sub" / ".lock"  # the folder is created
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def first():
        with file_lock(lock):
            order.append("first in")
            inside.set()
            release.wait(10)
            order.append("first out")

    def second():
        inside.wait(10)
        with file_lock(lock):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    inside.wait(10)
    threads[1].join(0.3)  # the second thread cannot get in while the first holds the lock
    assert threads[1].is_alive() and order == ["first in"]
    release.set()
    for t in threads:
        t.join(10)
    assert order == ["first in", "first out", "second in"]
    assert lock.is_file()
