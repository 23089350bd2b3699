"""HarmClassifier: fine-tune an open-weight judge on reference-metric soft labels (HarmMetric Eval), then
serve it as the `harmclassifier` judge. Flow: labels (training set, prompt split) -> train (LoRA,
first-token soft-label loss) -> evaluate (held-out HarmMetric scores)."""
