"""`chute convert` and its Beam form: copying records from any format into sharded `.crec` or ArrayRecord, and what `inspect`/`verify` report."""
