"""One process of the embedded broker's stress test (test_broker.py):

    python -m tests.foundation.broker_load produce FOLDER TRANSPORT ID COUNT
    python -m tests.foundation.broker_load consume FOLDER TRANSPORT ID

A producer publishes COUNT messages to the queue ``load``; a consumer
acknowledges each message it gets and writes its ``producer:number`` as a
line of FOLDER/consumed-ID, until FOLDER/produced exists and the queue has
stayed empty for a moment. Plain kombu, as Celery uses it (acknowledged
messages, one prefetched at a time), with no Django.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kombu import Connection, Consumer, Exchange, Producer, Queue

QUEUE = Queue("load", Exchange("load"), routing_key="load")
IDLE_S = 1.0


def connection(folder: Path, transport: str) -> Connection:
    messages = str(folder / "messages")
    return Connection(
        "filesystem://localhost/",
        transport=transport,
        transport_options={
            "data_folder_in": messages,
            "data_folder_out": messages,
            "control_folder": str(folder / "control"),
            # Consumers poll as hard as they can: the race is in the polls.
            "polling_interval": 0.001,
        },
    )


def produce(folder: Path, transport: str, producer: str, count: int) -> None:
    with connection(folder, transport) as conn:
        publish = Producer(conn.channel()).publish
        for number in range(count):
            publish(
                {"producer": producer, "number": number},
                exchange=QUEUE.exchange,
                routing_key="load",
                declare=[QUEUE],
                serializer="json",
            )


def consume(folder: Path, transport: str, consumer: str) -> None:
    out = (folder / f"consumed-{consumer}").open("a", buffering=1)

    def got(body, message):
        out.write(f"{body['producer']}:{body['number']}\n")
        message.ack()

    with connection(folder, transport) as conn:
        consumer = Consumer(
            conn.channel(), [QUEUE], callbacks=[got], accept=["json"], prefetch_count=1
        )
        with consumer:
            while True:
                try:
                    conn.drain_events(timeout=IDLE_S)
                except TimeoutError:
                    if (folder / "produced").exists():
                        return


if __name__ == "__main__":
    role, folder, transport, name, *count = sys.argv[1:]
    if role == "produce":
        produce(Path(folder), transport, name, int(count[0]))
    else:
        consume(Path(folder), transport, name)
