"""The embedded broker: kombu's filesystem transport, safe for several
processes at once.

kombu's own transport creates a message file under its final name and then
writes it, so a consumer listing the folder in between takes an empty file and
dies on its JSON (kombu issue #1551); it creates an exchange table the same
way, so a publisher can read an empty table and drop its message as
undeliverable. Here a message is written under a name no consumer looks for
and renamed into place whole; a consumer claims a message by renaming it to a
name of its own before reading it (of several consumers, exactly one rename
succeeds: the others skip the file); an exchange table is created whole, by a
hard link that fails when another process created it first.

Settings name this module's ``Transport`` (``CELERY_BROKER_TRANSPORT``) when
``CELERY_BROKER_URL`` is ``filesystem://``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections import deque
from queue import Empty

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)

# A message written by a writer of kombu's own kind may still be filling when
# it is claimed (its writer keeps the file open across the rename): it is
# read again for this long before it is set aside.
PARTIAL_WAIT_S = 1.0
PARTIAL_EVERY_S = 0.02


def _temporary(folder: str) -> str:
    """A path in ``folder`` that no consumer reads: a message's queue is
    what follows the first dot of its name, and this one ends in .tmp."""
    return os.path.join(folder, f".{uuid.uuid4().hex}.tmp")


def _write_whole(path: str, data: bytes) -> None:
    """Write ``data`` at ``path`` so that no reader ever sees part of it."""
    temporary = _temporary(os.path.dirname(path))
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
        os.rename(temporary, path)
    except OSError:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


class Channel(filesystem.Channel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Per queue, message names from the last listing not yet tried: a
        # folder of thousands is listed once per thousands of messages, not
        # once per message.
        self._listed: dict[str, deque[str]] = {}

    def _put(self, queue, payload, **kwargs):
        # Zero-padded: names sort in the order they were written.
        name = f"{round(time.monotonic() * 1000):016d}_{uuid.uuid4()}.{queue}.msg"
        path = os.path.join(self.data_folder_out, name)
        try:
            _write_whole(path, str_to_bytes(dumps(payload)))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {path!r} to directory") from exc

    def _get(self, queue):
        folder = self.data_folder_in
        names = self._listed.get(queue)
        if not names:
            wanted = f"{queue}.msg"
            names = self._listed[queue] = deque(
                sorted(n for n in os.listdir(folder) if n.partition(".")[2] == wanted)
            )
        while names:
            name = names.popleft()
            claimed = os.path.join(folder, f"{name}.{uuid.uuid4().hex[:12]}.claimed")
            try:
                os.rename(os.path.join(folder, name), claimed)
            except FileNotFoundError:
                continue  # another consumer took it
            payload = self._read_claimed(claimed, name)
            if payload is not None:
                return payload
        raise Empty()

    def _read_claimed(self, path: str, name: str):
        """The message in a file this consumer claimed, or None (logged, and
        the file kept beside the queue as .unreadable) when it never becomes
        whole JSON."""
        deadline = time.monotonic() + PARTIAL_WAIT_S
        while True:
            try:
                with open(path, "rb") as handle:
                    # kombu's own writer holds an exclusive lock while writing.
                    filesystem.lock(handle, filesystem.LOCK_SH)
                    try:
                        data = handle.read()
                    finally:
                        filesystem.unlock(handle)
            except OSError as exc:
                raise ChannelError(f"Cannot read file {path!r} from queue.") from exc
            try:
                payload = loads(bytes_to_str(data))
                break
            except ValueError:
                if time.monotonic() >= deadline:
                    os.rename(path, path + ".unreadable")
                    log.error(
                        "broker message %s is not whole JSON (%d bytes): set aside "
                        "as %s.unreadable",
                        name,
                        len(data),
                        path,
                    )
                    return None
                time.sleep(PARTIAL_EVERY_S)
        if self.store_processed:
            shutil.move(path, os.path.join(self.processed_folder, name))
        else:
            os.remove(path)
        return payload

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        # kombu creates a missing table by opening it for writing, then
        # writing: created whole here, its entry is then added under its
        # lock by kombu's own code.
        table = self._exchange_file(exchange)
        if not table.exists():
            self.control_folder.mkdir(parents=True, exist_ok=True)
            temporary = _temporary(str(self.control_folder))
            try:
                with open(temporary, "wb") as handle:
                    handle.write(b"[]")
                os.link(temporary, table)
            except FileExistsError:
                pass  # another process created it first: its table is kept
            except OSError as exc:
                raise ChannelError(f"Cannot open {table}") from exc
            finally:
                try:
                    os.unlink(temporary)
                except FileNotFoundError:
                    pass
        super()._queue_bind(exchange, routing_key, pattern, queue)


class Transport(filesystem.Transport):
    Channel = Channel
