"""The bench room: accuracy and latency of every backend of a run, on the host and on devices.

- `measure.py`: the stage (`bench(run) -> BenchReport`), host and device together;
- `options.py`: what to measure and where (`BenchOptions`, `DeviceTarget`);
- `host.py`: each backend opened, scored and timed on the host;
- `device.py`: the rows of a device, through a runner of `deploy.runners`;
- `model_file.py`: a flatbuffer or ONNX file of your own, outside a run;
- `profile.py`, `scoring.py`, `report_md.py`: where the device time goes, the scores, the report.

It may import `bnnexport.run`, `bnnexport.nn`, the convert stage (the batch-N copy a device
needs), `converters` and `deploy`; outside it only the pipeline and the CLI import it.
"""
