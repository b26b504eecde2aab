FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY router ./router
COPY policies ./policies
RUN pip install --no-cache-dir . && useradd --create-home router && mkdir /data && chown router /data
USER router
ENV ROUTER_HOST=0.0.0.0 ROUTER_PORT=8080 ROUTER_STORE=sqlite:////data/router.db
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz')"
ENTRYPOINT ["router", "serve"]
