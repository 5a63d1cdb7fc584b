"""The embedded broker (runners.broker) under load from several processes, and
the files a consumer may meet: one still being written, one that never
becomes a message."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from kombu import Connection, Exchange, Queue

from matrix import config

from .broker_load import connection

ROOT = Path(__file__).resolve().parents[2]
TRANSPORT = config.broker_transport("filesystem://")
PRODUCERS = 4
PER_PRODUCER = 2_500
CONSUMERS = 3


def start(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.foundation.broker_load", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_many_producers_and_consumers_lose_and_duplicate_nothing(tmp_path):
    (tmp_path / "messages").mkdir()
    consumers = [start("consume", tmp_path, TRANSPORT, c) for c in range(CONSUMERS)]
    producers = [
        start("produce", tmp_path, TRANSPORT, p, PER_PRODUCER) for p in range(PRODUCERS)
    ]
    for proc in producers:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    (tmp_path / "produced").touch()
    for proc in consumers:
        out, _ = proc.communicate(timeout=120)
        # A consumer that died (kombu's transport: "JSONDecodeError") fails
        # here, and the messages it had claimed are missing below.
        assert proc.returncode == 0, out

    consumed = Counter(
        line
        for c in range(CONSUMERS)
        for line in (tmp_path / f"consumed-{c}").read_text().splitlines()
    )
    sent = {f"{p}:{n}" for p in range(PRODUCERS) for n in range(PER_PRODUCER)}
    assert sorted(sent - set(consumed))[:10] == []  # lost
    assert [m for m, times in consumed.items() if times > 1][:10] == []  # duplicated
    assert set(consumed) == sent
    # Every consumer took its share: they really competed for the files.
    assert all((tmp_path / f"consumed-{c}").stat().st_size for c in range(CONSUMERS))
    assert list((tmp_path / "messages").iterdir()) == []


def queue_for(tmp_path: Path) -> Queue:
    """A queue of the test's own: kombu keeps the bindings it declared for
    the whole process, whatever folder they were written to."""
    name = tmp_path.name.replace("_", "-")[:40]
    return Queue(name, Exchange(name), routing_key=name)


def queue_connection(folder: Path) -> Connection:
    (folder / "messages").mkdir(exist_ok=True)
    return connection(folder, TRANSPORT)


def test_a_message_claimed_while_its_writer_still_fills_it_is_read_whole(tmp_path):
    """kombu's own writer creates the file, then writes it: a consumer of
    this transport that claims it in between waits for the writer."""
    load = queue_for(tmp_path)
    with connection(tmp_path / "kombu", "filesystem") as kombu_own:
        (tmp_path / "kombu" / "messages").mkdir(parents=True)
        kombu_own.SimpleQueue(load).put({"n": 1}, serializer="json")
    (written,) = (tmp_path / "kombu" / "messages").iterdir()
    with queue_connection(tmp_path) as conn:
        queue = conn.SimpleQueue(load)
        handle = (tmp_path / "messages" / written.name).open("wb")

        def fill():
            time.sleep(0.2)
            handle.write(written.read_bytes())
            handle.close()

        writer = threading.Thread(target=fill)
        writer.start()
        message = queue.get(timeout=5)
        writer.join()
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()


def test_a_file_that_never_becomes_a_message_is_set_aside_and_the_next_is_read(
    tmp_path,
):
    load = queue_for(tmp_path)
    with queue_connection(tmp_path) as conn:
        queue = conn.SimpleQueue(load)
        bad = tmp_path / "messages" / f"0000000000000001_bad.{load.name}.msg"
        bad.write_text("{not js")
        queue.put({"n": 2}, serializer="json")
        message = queue.get(timeout=5)
        assert message.payload == {"n": 2}
        message.ack()
        queue.close()
    (aside,) = (tmp_path / "messages").glob("*.unreadable")
    assert aside.read_text() == "{not js"
