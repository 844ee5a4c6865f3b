"""The paper's qualitative analysis of Adidas (section "Qualitative Analysis and Case Study",
Figure 4, the human evaluation, Appendix "Details for Adidas Qualitative Studies").

- ``style``: the top-50 "Adidas domain" words and their coverage in generated text;
- ``trace``: base and Plugin probabilities of those words along a Plugin decode (Figure 4);
- ``preference``: an automatic proxy for the human side-by-side study (embedding and
  ROUGE-L judges, bootstrap interval, sign test);
- ``sheet``: HTML and CSV material to run the human study yourself.
"""
from .preference import (
    Embedder,
    embedding_similarity,
    preference_outcomes,
    preference_proxy,
    preference_summary,
    rouge_l_similarity,
)
from .sheet import (
    SheetItem,
    export_preference_sheet,
    sheet_items,
    tally_preference_sheet,
)
from .style import (
    COVERAGE_READINGS,
    adidas_descriptions,
    content_words,
    coverage_counts,
    coverage_readings,
    domain_word_coverage,
    style_words,
)
from .trace import trace_token_probabilities, word_first_token

__all__ = [
    "COVERAGE_READINGS", "Embedder", "SheetItem", "adidas_descriptions", "content_words", "coverage_counts",
    "coverage_readings", "domain_word_coverage", "embedding_similarity",
    "export_preference_sheet", "preference_outcomes", "preference_proxy", "preference_summary",
    "rouge_l_similarity", "sheet_items", "style_words", "tally_preference_sheet",
    "trace_token_probabilities", "word_first_token",
]
