"""`laneway bench <mode>`: one module per mode, each with its arguments
(`add_arguments`) and its run (`run`), and the result file they all write
(`results`)."""
