"""Every placer file's header is checked by one function (graphs.schema.document), with one wording."""

from __future__ import annotations

import pytest

from envs.cluster import Cluster
from envs.real.profiler import check_profile
from graphs import PlacerError, io
from graphs.grouping import Grouping
from graphs.plan import Placement

READERS = {
    "graph": io.from_dict,
    "grouping": Grouping.from_dict,
    "placement": Placement.from_dict,
    "cluster": Cluster.from_dict,
    "profile": check_profile,
}


@pytest.mark.parametrize("kind", READERS)
def test_same_header_errors_for_every_file_kind(kind):
    with pytest.raises(PlacerError, match=r"^x\.json: expected a JSON object at top level$"):
        READERS[kind]([1, 2], source="x.json")
    with pytest.raises(PlacerError, match=r"^x\.json: format is 'other/9', expected 'placer-"):
        READERS[kind]({"format": "other/9"}, source="x.json")


def test_cluster_and_placement_load_through_one_reader(tmp_path):
    (tmp_path / "bad.json").write_text("[1]")
    for load in (Cluster.load, Placement.load):
        with pytest.raises(PlacerError, match="bad.json: expected a JSON object at top level"):
            load(tmp_path / "bad.json")
