"""`python -m walqueue.ctl`: walqueue-ctl without its console script."""

from walqueue.ctl import main

main()
