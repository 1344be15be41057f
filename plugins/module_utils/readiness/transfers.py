"""Weights that arrive by other ways than a read from the local disk, from one look to the next.

A model given by its hub id is downloaded first: huggingface_hub receives with recv(), which no
/proc/<pid>/io counter but the written ones sees, into `blobs/<etag>.incomplete` files of the hub
cache (host/hub_cache.py). A streamed load (the Run:ai model streamer from an object store) reads a
socket with read(2): `rchar` grows, `read_bytes` does not. A load from a peer over RDMA does no
file I/O at all; the host's InfiniBand ports count what they receive (host/infiniband.py). This
module keeps the totals and the rate of each way; which growth counts as progress, and what the
messages say, is the classifier's rule.
"""
import dataclasses
from typing import Any, Dict, List, Optional

from .verdict import window_rate, windowed

DOWNLOAD = "download"
STREAM = "stream"
INFINIBAND = "infiniband"
WRITTEN = "written"


@dataclasses.dataclass
class TransferTracker(object):
    """Totals since the first look, per way (DOWNLOAD, STREAM, INFINIBAND, WRITTEN), in bytes."""
    totals: Dict[str, int] = dataclasses.field(default_factory=lambda: {DOWNLOAD: 0, STREAM: 0, INFINIBAND: 0, WRITTEN: 0})
    # The previous look's counters: the tree's written, read(2) and disk-read bytes, the IB ports'.
    prev: Dict[str, Optional[int]] = dataclasses.field(default_factory=dict)
    # Each .incomplete file's size at the previous look (by path): a finished file is renamed away.
    partial_sizes: Dict[str, int] = dataclasses.field(default_factory=dict)
    # The download seen last: {"repo", "file", "bytes", "since"} (since: when it last grew).
    download: Optional[Dict[str, Any]] = None
    download_t: Optional[float] = None  # when a downloaded byte last arrived
    source: Optional[str] = None  # the way the latest bytes came (DOWNLOAD, STREAM, INFINIBAND)
    source_t: Optional[float] = None  # when they came
    samples: List[List[float]] = dataclasses.field(default_factory=list)  # [t, bytes of `source`] over RATE_WINDOW
    socket_looks: int = 0  # consecutive looks whose reads beyond the disk had no weight file open

    def fold(self, t, process, downloads, ib_rcv_bytes):
        """One look's counters in; the growth since the previous look out, per way (None where
        the counter could not be read at both looks)."""
        growth = {
            DOWNLOAD: self._download_growth(t, downloads),
            # What the tree read with read(2) beyond what came from the disk: a socket (or the page cache).
            STREAM: self._stream_growth(process),
            INFINIBAND: self._growth("ib", ib_rcv_bytes),
            WRITTEN: self._written_growth(process),
        }
        for way, grown in growth.items():
            if grown:
                self.totals[way] += grown
        return growth

    def downloaded(self):
        """Whether this wait saw a download: reads beyond the disk after it are the downloaded files,
        read back from the page cache, not a stream."""
        return self.download is not None

    def arrived(self, t, way):
        """`way` brought bytes in at this look: it is the load's source now."""
        if self.source != way:
            self.samples = []
        self.source = way
        self.source_t = t
        self.samples = windowed(self.samples, t, self.totals[way])

    def rate(self):
        """Bytes/s of the current source over the last RATE_WINDOW seconds, or None."""
        return window_rate(self.samples)

    def _growth(self, name, value):
        prev = self.prev.get(name)
        self.prev[name] = value
        if value is None or prev is None:
            return None
        return max(0, value - prev)

    def _stream_growth(self, process):
        rchar = self._growth("rchar", process.rchar)
        disk = self._growth("read_bytes", process.read_bytes)
        if rchar is None:
            return None
        return max(0, rchar - (disk or 0))

    def _written_growth(self, process):
        # wchar counts write(2) calls as they happen; write_bytes what reaches the disk, later.
        grown = [g for g in (self._growth("wchar", process.wchar),
                             self._growth("write_bytes", process.write_bytes)) if g is not None]
        return max(grown) if grown else None

    def _download_growth(self, t, downloads):
        if not downloads:
            return None
        sizes = {}
        grown = 0
        for entry in downloads.get("files") or []:
            path = entry.get("path") or entry.get("blob")
            size = entry.get("bytes") or 0
            sizes[path] = size
            before = self.partial_sizes.get(path)
            # A file first seen at the first look is not news; one that appears later brings all it holds.
            if before is None and self.prev.get("downloads_seen"):
                before = 0
            if before is not None and size > before:
                grown += size - before
                self.download = {"repo": entry.get("repo"), "file": entry.get("file"), "blob": entry.get("blob"),
                                 "bytes": size, "since": t}
                self.download_t = t
        self.partial_sizes = sizes
        self.prev["downloads_seen"] = 1
        if self.download is not None and self.download.get("since") != t:
            # The file last seen growing: its size now, if it is still there.
            for entry in downloads.get("files") or []:
                if entry.get("blob") == self.download["blob"]:
                    self.download["bytes"] = entry.get("bytes") or 0
        return grown
