import signal

# A non-interactive shell starts `cmd &` with SIGINT ignored, and Python keeps an ignored signal
# ignored. Every command must stop on SIGINT however it was started, so take it back first,
# before the imports (which take a while) can swallow one.
signal.signal(signal.SIGINT, signal.default_int_handler)

from harness.cli import main  # noqa: E402

raise SystemExit(main())
