"""`python -m bnnexport` runs the command line."""

from bnnexport.cli import main

if __name__ == "__main__":
    main(prog_name="bnnexport")
