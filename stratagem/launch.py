"""`python -m stratagem.launch --strategy best.json --nproc-per-node N script.py [args]`.

The code lives in `stratagem.runtime.launch`; this module is only the command's entry point.
"""

from stratagem.runtime.launch import main

if __name__ == "__main__":
    raise SystemExit(main())
