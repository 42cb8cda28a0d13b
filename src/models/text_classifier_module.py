"""Text classification: a Hugging Face sequence classifier (model/net=hf) on tokenized, dynamically padded
batches; loss, metrics and predictions as for images (ClassifierModule)."""

from src.models.classifier_module import ClassifierModule


class TextClassifierModule(ClassifierModule):
    """A batch is `(inputs, labels)`: `inputs` a dict of `input_ids` and `attention_mask` (B, L), L the
    batch's longest text, which the net maps to (B, num_classes) logits; `labels` (B,). ClassifierModule's
    `step` and `predict_step` take it as it is (a batch to predict may be the `inputs` dict alone)."""

    task = "text_classification"
