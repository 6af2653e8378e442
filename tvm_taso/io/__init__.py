"""ONNX in and out: :func:`.onnx_import.load_onnx` and :func:`.onnx_export.export_onnx`."""
