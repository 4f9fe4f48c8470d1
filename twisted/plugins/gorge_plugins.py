"""twistd plugins for the four gorge daemons.

Nothing but ServiceMaker objects: ``twistd --help`` stays cheap and nothing
(least of all txredisapi, which binds the global reactor on import) is
imported until a subcommand is chosen.
"""

from twisted.application.service import ServiceMaker

gorge_webhook = ServiceMaker(
    "gorge-webhook", "gorge.webhook.service", "Herald webhook delivery for Phorge", "gorge-webhook"
)
gorge_mailer = ServiceMaker(
    "gorge-mailer", "gorge.mailer.service", "Outbound mail for Phorge", "gorge-mailer"
)
gorge_taskqueue = ServiceMaker(
    "gorge-taskqueue", "gorge.taskqueue.service", "Phorge work queue over HTTP", "gorge-taskqueue"
)
gorge_worker = ServiceMaker(
    "gorge-worker", "gorge.worker.service", "Phorge task worker", "gorge-worker"
)
