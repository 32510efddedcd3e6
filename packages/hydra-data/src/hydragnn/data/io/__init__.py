"""Files in and out: structure files read through ASE, their conversion into cached containers,
downloads, archives, safe ``torch.load`` and atomic writes.

- :mod:`.ase_io`: ASE ``Atoms`` <-> raw samples;
- :mod:`.ase_source`: :class:`~.ase_source.AseSource`, the frames of any file ASE reads, with
  :mod:`.xyz_scan` checking an (ext)xyz file's declared frame sizes first and :mod:`.ase_labels`
  reading each frame's labels (the outputs they fill, checked arrays);
- :mod:`.conversion`: :func:`~.conversion.convert_source`, a file converted once into a prepared
  container, the cache entries kept by :mod:`.conversion_cache`, the samples written by
  :mod:`.conversion_samples`;
- :mod:`.download`: the checksum-verified download cache;
- :mod:`.archives`: the files of a tar or zip archive (or a folder), without extraction;
- :mod:`.safe_load`: ``torch.load`` restricted to tensors and plain containers;
- :mod:`.atomic`: atomic file writes, shared by every layer.

Nothing is imported here: the public names are those of :mod:`hydragnn.data`, loaded on first use.
"""
