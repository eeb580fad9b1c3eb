"""The long-context extrapolation suite (docs/method.md §7): loss vs length, passkey retrieval, MQAR accuracy and
attention analysis, with the report, plots and paired statistics that compare runs."""
