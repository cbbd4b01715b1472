"""`python -m dpproxy.cli`: the `dpproxy` command."""

from dpproxy.cli import main

main()
