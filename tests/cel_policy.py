"""A ValidatingAdmissionPolicy's CEL run the way the API server runs it (match conditions, then the
variables in order, then the validations), for the tests of every policy we ship."""
from __future__ import annotations

import celpy

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


class CelPolicy:
    def __init__(self, docs: list[dict], name: str) -> None:
        self.spec = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"
                         and d["metadata"]["name"] == name)["spec"]
        env = celpy.Environment()

        def program(text: str):
            return env.program(env.compile(text))

        self.match = [program(m["expression"]) for m in self.spec.get("matchConditions", [])]
        self.variables = [(v["name"], program(v["expression"])) for v in self.spec.get("variables", [])]
        self.validations = [(v.get("message") or program(v["messageExpression"]), program(v["expression"]))
                            for v in self.spec["validations"]]

    def evaluate(self, request: dict, obj: dict, old: dict | None = None) -> str:
        """"not matched", "allowed", or the first failing validation's message."""
        activation = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
                      "oldObject": celpy.json_to_cel(old)}  # null on a CREATE, as the API server has it
        if not all(bool(p.evaluate(activation)) for p in self.match):
            return "not matched"
        variables = celpy.celtypes.MapType({})
        for name, program in self.variables:  # in order: a variable may use the ones before it
            variables[celpy.celtypes.StringType(name)] = program.evaluate(dict(activation, variables=variables))
        activation["variables"] = variables
        for message, program in self.validations:
            result = program.evaluate(activation)
            if isinstance(result, Exception) or not bool(result):
                return message if isinstance(message, str) else str(message.evaluate(activation))
        return "allowed"


def user_info(user: str, node_name: str | None) -> dict:
    """The request's userInfo. The API server leaves `extra` out when a token carries none (a token that
    is not node-bound), so a policy must not assume the key exists."""
    info: dict = {"username": user}
    if node_name is not None:
        info["extra"] = {NODE_NAME_EXTRA: [node_name]}
    return info
