"""Interchange with other tools' trace formats.

- :mod:`harness.interchange.et_format`: the MLCommons Chakra execution trace (ET) format, the
  input of ASTRA-sim: its message classes (built at run time from the schema's definitions, no
  ``protoc`` step) and its files (varint-delimited ``GlobalMetadata`` then ``Node`` messages);
- :mod:`harness.interchange.chakra`: what a torch.distributed script run's records mean in
  Chakra's terms and back (operations, sizes, process groups, attributes);
- :mod:`harness.interchange.chakra_export` and :mod:`harness.interchange.chakra_import`: a
  script run's results directory to one ET file per rank, and ET files to a results directory
  that ``simulate`` and ``compare`` replay (``python -m harness chakra``, docs/guides/chakra.md).
"""
