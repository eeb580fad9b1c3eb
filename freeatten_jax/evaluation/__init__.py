"""The long-context extrapolation suite (SPEC §7): loss vs length, passkey, attention analysis."""
