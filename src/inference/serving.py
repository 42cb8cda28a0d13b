"""A trained checkpoint answering HTTP requests, on LitServe: the model and its preprocessing are loaded as
predict loads them (src/run/trained_run.py, src/inference/inputs.py), in each of LitServe's model processes.

A request is `POST /predict` with the JSON `{"image": "<an image file's bytes, base64>"}`. What it answers is
the task's (ANSWERS): a classifier's class, class name and probabilities; a segmenter's mask as a PNG.
A bad request gets a 4xx with a one-line reason in `detail`, never a 500: the body's type and size are
checked before it is read (RequestLimits), its fields by FastAPI (one_line_validation_error), and the image
in the model process, one request at a time, so that one bad image in a batch fails no other request.
"""

import base64
import binascii
import io
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import litserve
import torch
from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from hydra.utils import get_object
from lightning import LightningModule
from omegaconf import DictConfig
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel
from torch import Tensor
from torch.utils.data import default_collate

from src.common.classes import names_or_indices
from src.inference.inputs import image_transform, require_file_preprocessing
from src.inference.segmentation_predictions import class_mask, mask_image  # [part: segmentation]
from src.run.extras import apply_extras
from src.run.trained_run import TrainedRun, load_model, locate

log = logging.getLogger(__name__)

ROUTE = "/predict"
REQUEST_FORMAT = '{"image": "<an image file\'s bytes, base64>"}'


class ImageRequest(BaseModel):
    """The body of a request: FastAPI parses and checks it before it reaches the model process."""

    image: str  # an image file's bytes (PNG, JPEG, ...), base64-encoded


@dataclass
class Decoded:
    """A request's image as the net's input, and the size it came in (height, width)."""

    image: Tensor
    size: tuple[int, int]


@dataclass
class Refused:
    """A request that gets a 4xx instead of an answer, with the reason."""

    status: int
    reason: str


def classification_answers(model: LightningModule, outputs: Tensor, sizes: list) -> list[dict[str, Any]]:
    """Per image: the most likely class, its name, and every class's probability (index = class)."""
    names = names_or_indices(model.label_names(), model.hparams.num_classes)
    answers = []
    for row in outputs:
        best = int(row.topk(1).indices[0])  # as predict chooses its `predicted`
        answers.append({"class": best, "class_name": names[best], "probabilities": row.tolist()})
    return answers


# part: segmentation
def segmentation_answers(model: LightningModule, outputs: Tensor, sizes: list) -> list[dict[str, Any]]:
    """Per image: its mask, the class index of each pixel at the image's own size, as a PNG in base64
    (what predict writes into masks/), and the class names the indices stand for."""
    names = names_or_indices(model.label_names(), model.hparams.num_classes)
    answers = []
    for probabilities, size in zip(outputs, sizes, strict=True):
        png = io.BytesIO()
        mask_image(class_mask(probabilities, size), model.hparams.num_classes).save(png, format="PNG")
        answers.append(
            {
                "mask_png": base64.b64encode(png.getvalue()).decode("ascii"),
                "height": size[0],
                "width": size[1],
                "class_names": names,
            }
        )
    return answers


# /part


# What each kind of task module answers (its `task`), from its `predict_step` outputs and the images' sizes.
ANSWERS: dict[str, Callable[[LightningModule, Tensor, list], list[dict[str, Any]]]] = {
    "classification": classification_answers,  # the class, its name, the probabilities
    "segmentation": segmentation_answers,  # the mask, as a PNG  [part: segmentation]
}


def answers_for(module: type) -> Callable[[LightningModule, Tensor, list], list[dict[str, Any]]]:
    """What a task module class answers; an error naming it when its task is not one serve answers."""
    task = getattr(module, "task", "any")
    if task not in ANSWERS:
        raise ValueError(
            f"{module.__name__} (task: {task}) cannot be served: serve answers the tasks "
            f"{', '.join(ANSWERS)}; add its answer to ANSWERS in src/inference/serving.py"
        )
    return ANSWERS[task]


class ModelAPI(litserve.LitAPI):
    """The model in one of LitServe's model processes: requests in, the task's answers out."""

    def __init__(
        self, source: TrainedRun, module: str | None, max_image_pixels: int, cpu_threads: int, **batching: Any
    ) -> None:
        super().__init__(api_path=ROUTE, **batching)
        self.source, self.module, self.max_image_pixels = source, module, max_image_pixels
        self.cpu_threads = cpu_threads

    def setup(self, device: str) -> None:
        if device == "cpu":
            torch.set_num_threads(self.cpu_threads)
        self.model = load_model(self.source, self.module).to(device)
        self.answers = answers_for(type(self.model))
        preprocessing = self.model.hparams.preprocessing
        self.mode, self.transform = preprocessing["image_mode"], image_transform(preprocessing)
        # The datamodule's own collate (a dotted path, e.g. padding mixed sizes), else PyTorch's, which stacks:
        # then every image must come out of the preprocessing at the training input's shape.
        collate = preprocessing.get("collate")
        self.collate = get_object(collate) if collate else default_collate
        self.shape = None if collate else preprocessing.get("input_shape")

    def decode_request(self, request: ImageRequest) -> Decoded | Refused:
        """The image as the net's input, read as predict reads an image file; a Refused for what is not."""
        try:
            data = base64.b64decode(request.image, validate=True)
        except (binascii.Error, ValueError):
            return Refused(400, f"image: not base64; send {REQUEST_FORMAT}")
        mode = "unknown"
        try:
            with Image.open(io.BytesIO(data)) as file:
                width, height = file.size
                if width * height > self.max_image_pixels:
                    return Refused(
                        413,
                        f"image: {width}x{height} is {width * height} pixels, over max_image_pixels="
                        f"{self.max_image_pixels}; send a smaller image",
                    )
                mode = file.mode
                image = file.convert(self.mode)
        except UnidentifiedImageError:
            return Refused(400, "image: the bytes are not an image file (PNG, JPEG, ... base64-encoded)")
        except Image.DecompressionBombError:
            return Refused(413, f"image: over max_image_pixels={self.max_image_pixels}; send a smaller image")
        except ValueError as err:  # PIL cannot convert its mode
            return Refused(400, f"image: a {mode} image cannot become {self.mode} ({err}); send L or RGB")
        except OSError as err:
            return Refused(400, f"image: cannot be read ({err})")
        try:
            tensor = self.transform(image)
        except Exception as err:  # the request's image fails the preprocessing: its fault, not ours
            return Refused(400, f"image: {width}x{height} fails the model's preprocessing ({err})")
        if self.shape is not None and list(tensor.shape) != list(self.shape):
            return Refused(
                400,
                f"image: {width}x{height} becomes {list(tensor.shape)} in the model's preprocessing, which "
                f"takes {list(self.shape)}; send an image of that size",
            )
        return Decoded(tensor, (height, width))

    def predict(self, x: Any) -> Any:
        """One forward pass over the decoded images of a batch (one request without batching), as predict
        runs `predict_step`; refused requests pass through untouched."""
        items = x if isinstance(x, list) else [x]
        decoded = [item for item in items if isinstance(item, Decoded)]
        answers = iter(())
        if decoded:
            batch = self.collate([(item.image, -1) for item in decoded])
            batch = [part.to(self.model.device) for part in batch]
            with torch.inference_mode():
                outputs = self.model.predict_step(batch, 0).float().cpu()
            answers = iter(self.answers(self.model, outputs, [item.size for item in decoded]))
        results = [next(answers) if isinstance(item, Decoded) else item for item in items]
        return results if isinstance(x, list) else results[0]

    def encode_response(self, output: dict[str, Any] | Refused) -> Any:
        if isinstance(output, Refused):
            return JSONResponse({"detail": output.reason}, status_code=output.status)
        return output


def cpu_threads(workers: int) -> int:
    """PyTorch threads for each model process on a CPU: the cores (a container's or taskset's share, where the
    OS says so) less one for the HTTP process, shared by the model processes. PyTorch's default, a thread per
    core in each, makes them wait on each other (on 2 cores, 16 clients, 2 model processes answer 74
    requests/s with it, 758 with one thread each)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, (cores - 1) // workers)


class RequestLimits:
    """Refuse a request to the model's route whose body is not JSON (415) or is over `max_body_bytes` (413),
    before its body is read (by its declared length) or while it is (a chunked body, by what came so far)."""

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] != ROUTE:
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]
        }
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        too_large = f"the body is over max_body_bytes={self.max_body_bytes}; send a smaller image"
        if kind != "application/json":
            refusal = JSONResponse(
                {"detail": f"Content-Type is {kind or 'missing'}; send application/json: {REQUEST_FORMAT}"},
                status_code=415,
            )
            await refusal(scope, receive, send)
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await JSONResponse({"detail": too_large}, status_code=413)(scope, receive, send)
            return
        received = 0

        async def counted() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                raise HTTPException(413, too_large)
            return message

        await self.app(scope, counted, send)


async def one_line_validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """FastAPI's refusal of a body (not JSON, a field missing or of another type) as one line, not a list."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return JSONResponse({"detail": f"{where}: {first['msg']}; send {REQUEST_FORMAT}"}, status_code=422)


def stop(signum: int, frame: Any) -> None:
    """SIGTERM (systemd, docker, Kubernetes) and Ctrl-C: end every process this one started, then this one,
    exit status 0. Not LitServe's own shutdown: SIGTERM's default ends this process alone and leaves its
    workers answering, and on Ctrl-C its worker monitor can take the workers it stops for dead ones and wait on
    them for good (litserve 0.2.19, seen under load)."""
    log.info(f"Stopping on {signal.Signals(signum).name}")
    stop_children()
    logging.shutdown()
    os._exit(0)


def stop_children() -> None:
    """End every process this one started that is still running: LitServe's workers and its manager."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(5)
        if child.is_alive():
            child.kill()


def default_signal_handlers() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def serve(cfg: DictConfig) -> None:
    """Serve the checkpoint of `cfg` until SIGTERM or Ctrl-C, which stop it and every process it started."""
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signal_number, stop)
    # The processes LitServe forks keep the usual handlers (stop() terminates them).
    os.register_at_fork(after_in_child=default_signal_handlers)
    apply_extras(cfg)
    source = locate(cfg)
    # Loaded here once, so that a checkpoint that cannot be served says so before any process starts.
    model = load_model(source, cfg.get("module"))
    answers_for(type(model))
    require_file_preprocessing(model.hparams.preprocessing, "predict on its test split with src/predict.py")
    batching = {"max_batch_size": cfg.max_batch_size, "batch_timeout": cfg.batch_timeout}
    threads = cpu_threads(cfg.workers)
    api = ModelAPI(source, cfg.get("module"), cfg.max_image_pixels, threads, **batching)
    server = litserve.LitServer(
        api,
        accelerator=cfg.accelerator,
        workers_per_device=cfg.workers,
        timeout=cfg.timeout,
        middlewares=[(RequestLimits, {"max_body_bytes": cfg.max_body_bytes})],
        model_metadata={"checkpoint": str(source.checkpoint), "task": model.task, "cpu_threads": threads},
    )
    server.app.add_exception_handler(RequestValidationError, one_line_validation_error)
    log.info(f"Serving {source.checkpoint} at http://{cfg.host}:{cfg.port}{ROUTE}")
    try:
        server.run(host=cfg.host, port=cfg.port, log_level=cfg.log_level, generate_client_file=False)
    finally:  # it failed: no process of its may outlive it
        stop_children()
