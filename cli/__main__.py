"""`python -m bytemtp_cli ...` (and `torchrun -m bytemtp_cli ...`) run the `bytemtp` command."""

from bytemtp_cli.main import main

main()
