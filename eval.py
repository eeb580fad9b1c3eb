"""Long-context extrapolation suite (issue 6): not implemented yet."""
import sys

if __name__ == "__main__":
    sys.exit("eval.py: not implemented yet (tracked in issue 6)")
