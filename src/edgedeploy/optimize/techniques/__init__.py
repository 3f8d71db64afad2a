"""The techniques of the deployment tree, one module each.

- :mod:`.baseline`: the tree's root, the user's model rewritten into layers every technique knows;
- :mod:`.prune`, :mod:`.cluster` (sparsity-preserving or not) and :mod:`.qat` (with its scheme): the TFMOT
  techniques, with :mod:`.selection` (which layers they optimize, and mirrored fine-tuning);
- :mod:`.two_of_four`: 2:4 pruning and its check after each stage;
- :mod:`.thin`: the ``thin`` technique (fewer output channels, widths chosen by the NPU's cycles), with
  :mod:`.thin_widths` (the per-group widths toward a cycle budget), :mod:`.thin_recover` (which channels stay,
  and how the layers reading them recover) and :mod:`.thin_vela` (the candidate widths compiled with Vela).

:mod:`edgedeploy.optimize.registry` names them.
"""
