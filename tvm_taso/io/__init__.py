"""ONNX in and out: :func:`.onnx_model.load_onnx` keeps a model as ONNX (:mod:`.onnx_bridge` maps it
to the engine's graph and back), :func:`.onnx_import.import_relax` imports it into Relax through
TVM, and :func:`.onnx_export.relax_to_onnx` writes a Relax module as ONNX. PyTorch in:
:func:`.torch_import.from_torch`, through ``torch.export`` and TVM's PyTorch frontend."""
