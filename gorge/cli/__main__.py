"""``python -m gorge.cli``: the ``gorge`` command without its console script
(what the tests and a checkout without the install run)."""

from gorge.cli.main import main

main()
