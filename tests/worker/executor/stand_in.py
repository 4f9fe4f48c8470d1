"""A stand-in for phorge/scripts/gorge-executor.php that speaks the same wire
(requests on fd 3, answers on fd 4, one JSON object a line) without PHP or
Phorge, so the pool's supervision can be driven into every corner. The task
class says what to do:

- ``Succeed``: answer success (with the request's ``followups`` echoed);
- ``Print``: print to stdout and stderr, then succeed;
- ``Die``: exit with status 3 before answering;
- ``Hang``: never answer;
- ``Grow``: succeed, reporting ``memory`` from the request's data.

``STAND_IN_FATAL`` in the environment makes it say fatal and exit at once;
``STAND_IN_FATAL_FILE`` does so while that file exists.
"""

import json
import os
import signal
import sys


def say(out, message):
    out.write(json.dumps(message) + "\n")
    out.flush()


def main() -> int:
    out = os.fdopen(4, "w")
    fatal_file = os.environ.get("STAND_IN_FATAL_FILE")
    if os.environ.get("STAND_IN_FATAL") or (fatal_file and os.path.exists(fatal_file)):
        say(out, {"type": "fatal", "error": "Phorge is broken here"})
        return 1
    say(out, {"type": "ready", "pid": os.getpid(), "php": "stand-in"})
    for line in os.fdopen(3):
        request = json.loads(line)
        kind = request["taskClass"]
        answer = {"result": "success", "duration": 1}
        memory = 1000
        if kind == "Print":
            print("a line on stdout", flush=True)
            print("a line on stderr", file=sys.stderr, flush=True)
        elif kind == "Die":
            os._exit(3)
        elif kind == "Hang":
            signal.pause()  # until the pool kills it
        elif kind == "Grow":
            memory = int(request["data"])
        answer["followups"] = request.get("followups", [])
        answer["pid"] = os.getpid()
        say(out, {"id": request["id"], "answer": answer, "memory": memory})
    return 0


if __name__ == "__main__":
    sys.exit(main())
