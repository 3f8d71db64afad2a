"""A functional model of the Ethos-U55 and Ethos-U65 command stream.

It reads a compiled leaf (the ``ethos-u`` custom operator of a ``*_vela.tflite``, or Vela's raw ``.npz``), sets
up the memory regions as the driver does, decodes the register command stream and executes it in NumPy:
DMA, convolution, depthwise convolution, pooling and elementwise operations, with weights decoded by Vela's own
codec. It computes results only; it does not model time. A command or register setting it does not implement
stops with :class:`~edgedeploy.errors.NpuModelError` naming it.

``leaf`` reads the compiled model, ``commands`` decodes the stream, ``featuremap`` reads and writes feature
maps, ``weights`` decodes weight and scale streams, ``arith`` holds the rounding rules, ``ops`` executes
convolutions and pooling and holds the output stage, ``elementwise`` the elementwise operations, ``bounds``
checks the memory and work a leaf's declared sizes ask for, ``machine`` runs a stream over a batch of inputs,
``reference`` runs TFLite's reference kernels and ``verify`` compares (``fused_tables`` recognises the documented
fully-connected difference behind an activation table fused into the same operation).

Ethos-U85 streams are decoded (``u85_commands`` holds its register set, ``u85_describe`` says what each operation
does, ``u85_weights`` decodes its weight and scale streams); ``u85_ops`` executes DMA, convolution and pooling
and stops, before a stream runs, at the first operation it does not execute.
"""
