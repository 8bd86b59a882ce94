"""A delay line between the executor hosts and their database: a TCP relay in the root
namespace, on the test network's address, that holds every chunk for half the added round
trip in each direction, in order, before passing it on to the database.

Why not ``tc qdisc ... netem delay``: this machine's kernel is built without the netem qdisc
(``CONFIG_NET_SCH_NETEM`` is not set; ``tc`` answers "Specified qdisc kind is unknown"), and no
other qdisc it has delays packets. The relay adds its own CPU and a little jitter, so the runs
report a relay with no delay beside the direct connection.

``python -m tests.hosts.relay --listen HOST --target-port P --delay-ms D``: the first line on
stdout is the port it listens on."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections import deque


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: deque[tuple[float, bytes]] = deque()
    arrived = asyncio.Event()
    done = False

    async def sender() -> None:
        while queue or not done:
            if not queue:
                arrived.clear()
                await arrived.wait()
                continue
            due, chunk = queue.popleft()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()

    sending = asyncio.create_task(sender())
    try:
        while chunk := await reader.read(65536):
            queue.append((loop.time() + delay, chunk))
            arrived.set()
    except ConnectionError:
        pass
    finally:
        done = True
        arrived.set()
        with contextlib.suppress(ConnectionError):
            await sending
        writer.close()


async def _serve(listen: str, target_host: str, target_port: int, delay: float) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            _pipe(reader, up_writer, delay), _pipe(up_reader, writer, delay), return_exceptions=True
        )

    server = await asyncio.start_server(relay, listen, 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--target-host", default="127.0.0.1")
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True, help="added round trip")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.listen, args.target_host, args.target_port, args.delay_ms / 2000))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
