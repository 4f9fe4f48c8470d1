# twistd -y tests/worker/recorded_worker.tac: gorge-worker with the test-only
# RecordedWorker class (tests/worker/recorded_worker.py says what it does).
from tests.worker.recorded_worker import application_from_env

application = application_from_env()
