"""The fourth preregistered wave (issue 73): the units its claims need, on the ``wave4`` profile.

Its runs are the ``wave4`` profile's own, on its frozen inputs:

- on the four datasets, notebook 15's arms from a pretrained small model (proxy-tuning and
  DExperts as published: NewModel-, ProxyTuning-, DExperts- and Plugin-pretrained), beside the
  1-layer Plugin and Zeroshot;
- on WebNLG, CommonGen and Adidas, notebook 06's bases (the original and the longest fine-tune,
  with Zeroshot and the Plugin on each) and notebook 07's Plugin-4L, the random initialisation
  of Plugin-pretrained's depth.

    plugin-repro grid plan --profile wave4 --wave 4     # what is stored, what is left
    plugin-repro grid run --profile wave4 --wave 4      # compute it (resumes)
"""
from __future__ import annotations

from ..experiments import ablations, base_quality, proxy
from ..harness import grid
from ..harness.profile import Profile

PROFILE = "wave4"
PROXY_DATASETS = ("e2e", "webnlg", "commongen", "adidas")
FIGURE_DATASETS = ("webnlg", "commongen", "adidas")  # E2E's Figure 2 and 3 claims are wave 1's
PROXY_NOTEBOOK, BASE_NOTEBOOK, COMPLEXITY_NOTEBOOK = ("15_proxy_tuning", "06_fig2_base_quality",
                                                      "07_fig3_reweighting_complexity")


def units(profile: Profile) -> list[grid.Unit]:
    """The wave's units (done ones included: the plan marks them). Notebook 15's from-scratch
    arms (NewModel, ProxyTuning, DExperts) are wave 3's claims, not this wave's: left out."""
    found = []
    for dataset in PROXY_DATASETS:
        found += grid.table_units(dataset, profile, PROXY_NOTEBOOK, method_names=["Zeroshot", "Plugin"])
        for model_name in profile.base_models:
            found += grid.task_units(grid.TaskRef(model_name, dataset), profile,
                                     proxy.pretrained_jobs(model_name, profile), PROXY_NOTEBOOK)
    for dataset in FIGURE_DATASETS:
        found += base_quality.units(profile, BASE_NOTEBOOK, dataset)
        found += ablations.complexity_units(profile, COMPLEXITY_NOTEBOOK, dataset)
    return grid.merge(found)
