#!/usr/bin/env python3
"""A Sluice gRPC worker in Python: takes jobs from the sidecar's `sluice.v1.Worker` stream and runs them.

    python3 worker.py --target 127.0.0.1:9903 --queue emails --slots 8

The sidecar (worker role with SLUICE_GRPC_LISTEN=127.0.0.1:9903) pushes up to `--slots` jobs at a time;
each runs in a thread of its own, is named in a heartbeat while it runs, and its outcome goes back on the
stream. `handle` below is the part to replace: return SUCCEEDED, raise Retry/Fail, or watch `cancelled`.
With `--exit-when-idle S` the worker asks the sidecar to drain once it had no job for S seconds, and exits
when the stream ends (used by the tests; a real worker runs until it is stopped). It prints `done <id>` for
each job it completed.

Callers checked (`queueApi.auth: kubernetes`): the worker sends the ServiceAccount token in the file that
`--token-file` names (default: `$SLUICE_QUEUE_API_TOKEN_FILE`, which the operator sets in a gRPC handler
container, `/var/run/secrets/sluice.dev/token`) as `authorization: Bearer <token>`, read again for each
stream, when the file exists. A stream the sidecar ends with UNAUTHENTICATED (the token was refused when
the stream opened, e.g. read just before the kubelet rotated it) or UNAVAILABLE (the API server could not
be asked) is opened again with the current token, after a pause; any other error ends the worker. An open
stream outlives its token: the sidecar authenticates once per stream and re-checks only the right.
"""

import argparse
import json
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402

from sluice.v1 import worker_pb2 as pb  # noqa: E402
from sluice.v1 import worker_pb2_grpc as pb_grpc  # noqa: E402


class Retry(Exception):
    """Fail this attempt; the job is retried (after `delay_ms`, else the queue's backoff)."""

    def __init__(self, error, delay_ms=None):
        super().__init__(error)
        self.delay_ms = delay_ms


class Fail(Exception):
    """Fail the job for good: it goes to `dead` at once."""


SUCCEEDED = "succeeded"


def handle(job, payload, cancelled):
    """Runs one attempt of `job` (a pb.Job) with its decoded `payload`. `cancelled` is a threading.Event
    set when cancellation is requested. This example does nothing and succeeds."""
    if cancelled.is_set():
        return "cancelled"
    return SUCCEEDED


# Stream ends after which the worker opens a new stream rather than exiting.
REOPEN = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE)


def metadata(token_file):
    """The call's metadata: the token in `token_file`, when there is one."""
    if not token_file or not os.path.exists(token_file):
        return ()
    with open(token_file) as f:
        token = f.read().strip()
    return (("authorization", f"Bearer {token}"),) if token else ()


class Worker:
    def __init__(self, args):
        self.args = args
        self.outbox = queue.Queue()
        self.lock = threading.Lock()
        self.in_hand = {}  # job_id -> (attempt, cancelled event)
        self.heartbeat_s = 10.0
        self.last_activity = time.monotonic()
        self.draining = False  # this stream takes no more jobs
        self.stopping = False  # the worker asked to drain: it exits when the stream ends
        self.pool = ThreadPoolExecutor(max_workers=args.slots)

    def send(self, **msg):
        self.outbox.put(pb.WorkerMessage(**msg))

    def requests(self, outbox):
        while True:
            msg = outbox.get()
            if msg is None:
                return
            yield msg

    def run_job(self, job, cancelled):
        try:
            payload = json.loads(job.payload_json)
            result = handle(job, payload, cancelled)
            if result == SUCCEEDED:
                outcome = pb.Outcome(job_id=job.job_id, attempt=job.attempt, succeeded=pb.Succeeded())
            else:
                outcome = pb.Outcome(job_id=job.job_id, attempt=job.attempt, cancelled=pb.Cancelled())
        except Retry as e:
            retry = pb.Retry(error=str(e))
            if e.delay_ms is not None:
                retry.delay_ms = e.delay_ms
            outcome = pb.Outcome(job_id=job.job_id, attempt=job.attempt, retry=retry)
        except Fail as e:
            outcome = pb.Outcome(job_id=job.job_id, attempt=job.attempt, fail=pb.Fail(error=str(e)))
        except Exception as e:  # a bug in the handler: retry, keeping the error
            outcome = pb.Outcome(job_id=job.job_id, attempt=job.attempt, retry=pb.Retry(error=repr(e)))
        with self.lock:
            held = self.in_hand.pop(job.job_id, None)
            self.last_activity = time.monotonic()
        if held is None:
            return  # the sidecar took the job back (lease_lost): this result would be refused
        self.send(outcome=outcome)
        if outcome.WhichOneof("result") == "succeeded":
            with self.lock:  # one whole line at a time
                sys.stdout.write(f"done {job.job_id}\n")
                sys.stdout.flush()

    def background(self, stopped):
        """Heartbeats for the jobs in hand; the idle drain; until `stopped` is set."""
        next_beat = time.monotonic()
        while not stopped.wait(0.05):
            now = time.monotonic()
            with self.lock:
                jobs = [pb.JobRef(job_id=i, attempt=a) for i, (a, _) in self.in_hand.items()]
                idle = not self.in_hand and now - self.last_activity >= (self.args.exit_when_idle or 0)
            if jobs and now >= next_beat:
                self.send(heartbeat=pb.Heartbeat(jobs=jobs))
                next_beat = now + self.heartbeat_s / 3
            if self.args.exit_when_idle and idle and not self.draining:
                self.drain()

    def drain(self):
        self.draining = True
        self.stopping = True
        self.send(drain=pb.Drain())

    def run(self):
        channel = grpc.insecure_channel(self.args.target)
        grpc.channel_ready_future(channel).result(timeout=self.args.connect_timeout)
        stub = pb_grpc.WorkerStub(channel)
        signal.signal(signal.SIGTERM, lambda *_: self.drain())
        pause = 0.5
        try:
            while True:
                started = time.monotonic()
                try:
                    self.stream(stub)
                    return
                except grpc.RpcError as e:
                    if self.stopping or e.code() not in REOPEN:
                        raise
                    if time.monotonic() - started > 60:
                        pause = 0.5  # a stream that served a while: not a failing loop
                    print(f"stream ended ({e.code().name}: {e.details()}); opening another in {pause:.1f}s",
                          file=sys.stderr, flush=True)
                    time.sleep(pause)
                    pause = min(pause * 2, 10.0)
        finally:
            self.pool.shutdown(wait=True)
            channel.close()

    def stream(self, stub):
        """One stream, until it ends; raises grpc.RpcError when it ends with an error."""
        self.outbox = queue.Queue()
        self.draining = False
        with self.lock:
            self.in_hand.clear()  # jobs of an earlier stream: the sidecar took them back
        self.send(subscribe=pb.Subscribe(queues=self.args.queue, slots=self.args.slots, worker_name="python-example"))
        stopped = threading.Event()
        threading.Thread(target=self.background, args=(stopped,), daemon=True).start()
        outbox = self.outbox
        try:
            for msg in stub.Work(self.requests(outbox), metadata=metadata(self.args.token_file)):
                kind = msg.WhichOneof("msg")
                if kind == "job":
                    job = msg.job
                    cancelled = threading.Event()
                    with self.lock:
                        self.in_hand[job.job_id] = (job.attempt, cancelled)
                        self.last_activity = time.monotonic()
                        self.heartbeat_s = min(self.heartbeat_s, job.heartbeat_within_ms / 1000)
                    self.pool.submit(self.run_job, job, cancelled)
                elif kind == "cancel":
                    with self.lock:
                        held = self.in_hand.get(msg.cancel.job_id)
                    if held:
                        held[1].set()
                elif kind == "lease_lost":
                    with self.lock:
                        self.in_hand.pop(msg.lease_lost.job_id, None)
                    print(f"lease lost {msg.lease_lost.job_id}: {msg.lease_lost.reason}", file=sys.stderr, flush=True)
                elif kind == "refused":
                    print(f"refused {msg.refused.job_id}: {msg.refused.reason}", file=sys.stderr, flush=True)
                elif kind == "draining":
                    self.draining = True
                elif kind == "subscribed":
                    print(f"subscribed as {msg.subscribed.owner} to {', '.join(msg.subscribed.queues)}", file=sys.stderr, flush=True)
        finally:
            stopped.set()
            outbox.put(None)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="127.0.0.1:9903", help="the sidecar's gRPC address")
    p.add_argument("--queue", action="append", default=[], help="a queue to take jobs from (repeat; none: all the sidecar serves)")
    p.add_argument("--slots", type=int, default=8, help="jobs at once")
    p.add_argument("--exit-when-idle", type=float, default=None, metavar="SECONDS", help="drain and exit after this long without a job")
    p.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS")
    p.add_argument("--token-file", default=os.environ.get("SLUICE_QUEUE_API_TOKEN_FILE"),
                   help="a ServiceAccount token (audience sluice) to send, when the file exists "
                        "(default: $SLUICE_QUEUE_API_TOKEN_FILE)")
    Worker(p.parse_args()).run()


if __name__ == "__main__":
    main()
