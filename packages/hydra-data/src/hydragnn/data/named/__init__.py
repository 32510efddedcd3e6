"""The published LSMS data sets a run can name (``CuAu_32atoms``, ``FePt_32atoms``, ``FeSi_1024atoms``).

- :mod:`.datasets`: the registry (torch-free: the run config validates names before torch loads);
- :mod:`.fetch`: the raw archive, placed by hand, in the download cache or downloaded once;
- :mod:`.lsms`: the LSMS raw text format, read into samples;
- :mod:`.prepare`: :func:`~.prepare.prepare_named_dataset`, the archive parsed and prepared once
  into a cached container;
- :mod:`.lsms_synthetic`: synthetic structures in the LSMS format, for tests and demonstrations.

Nothing is imported here: the public names are those of :mod:`hydragnn.data`, loaded on first use.
"""
