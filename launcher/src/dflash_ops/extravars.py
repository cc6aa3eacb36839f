"""The extra vars file of a job, written as AWX writes it: the job template's own extra_vars as saved (Ansible may
template them), every launch-time answer tagged !unsafe (never templated: operator input is data)."""
import yaml


class _Unsafe(str):
    pass


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Unsafe, lambda dumper, value: dumper.represent_scalar("!unsafe", str(value), style='"'))


def _unsafe(value):
    """Tag every string inside an answer (keys too: a dict key can hold a template as well)."""
    if isinstance(value, str):
        return _Unsafe(value)
    if isinstance(value, dict):
        return {_unsafe(k): _unsafe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unsafe(v) for v in value]
    return value


def render(template_vars, answers):
    """YAML for ansible-playbook -e @file: answers win over the template's vars, as in AWX."""
    merged = dict(template_vars)
    merged.update((name, _unsafe(value)) for name, value in answers.items())  # names: the survey's own
    return "---\n# job template extra_vars (trusted) + launch-time answers (!unsafe)\n" + yaml.dump(
        merged, Dumper=_Dumper, default_flow_style=False, sort_keys=True, allow_unicode=True)
