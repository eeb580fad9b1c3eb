"""The long-context extrapolation suite (docs/method.md §7): loss vs length, passkey, attention analysis."""
