"""`python -m walqueue.ctl`: walqueue-ctl without its console script."""

from walqueue.ctl import main

if __name__ == "__main__":  # importing this module (a docs tool, a walk of the package) runs nothing
    main()
